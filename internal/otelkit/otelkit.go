// Package otelkit is the OpenTelemetry plumbing the dedup packages share:
// a package's tracer and meter from the providers a user set, and the W3C
// trace context in a slice of message headers.
package otelkit

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// TracerMeter returns the tracer and the meter named name of the providers
// that are set, nil for one that is not, and false when neither is set: the
// caller then records nothing.
func TracerMeter(tp trace.TracerProvider, mp metric.MeterProvider, name string) (trace.Tracer, metric.Meter, bool) {
	if tp == nil && mp == nil {
		return nil, nil, false
	}
	var tracer trace.Tracer
	if tp != nil {
		tracer = tp.Tracer(name)
	}
	var meter metric.Meter
	if mp != nil {
		meter = mp.Meter(name)
	}
	return tracer, meter, true
}
