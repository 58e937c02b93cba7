// Command metrics serves the SDK's metrics in Prometheus format while it
// runs a small in-process workload, for trying the dashboard and the alert
// rules of deploy/ on: a consumer on a memory store (new events,
// redeliveries, a retry, dead letters, an outage of its dead-letter sink
// now and then) and an Idempotency-Key middleware (executions, replays,
// conflicts). It needs no service.
//
//	go run ./examples/metrics -addr 127.0.0.1:9464
//	curl -s 127.0.0.1:9464/metrics | grep ^dedup_
//
// Point a Prometheus at it (a scrape job with target 127.0.0.1:9464) and
// import deploy/grafana/dedup-dashboard.json. The outbox relay's metrics
// need PostgreSQL: see examples/quickstart -metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on")
	tick := flag.Duration("tick", time.Second, "time between rounds of the workload")
	rounds := flag.Int("rounds", 0, "rounds of the workload to run; 0: until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, *tick, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

// run serves /metrics on addr while it runs the workload's rounds.
func run(ctx context.Context, addr string, tick time.Duration, rounds int) error {
	reg := prometheus.NewRegistry()
	mp, err := meterProvider(reg)
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	wl, err := newWorkload(mp, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), 5*time.Second)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("serving the metrics at http://%s/metrics; Ctrl-C stops\n", ln.Addr())

	loop(ctx, wl, tick, rounds)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loop runs rounds of wl, one each tick, until ctx ends or rounds (unless
// 0) have run.
func loop(ctx context.Context, wl *workload, tick time.Duration, rounds int) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; rounds == 0 || i < rounds; i++ {
		if wl.round(ctx, i) != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// meterProvider returns a meter provider whose metrics reg serves, through
// the OpenTelemetry Prometheus exporter.
func meterProvider(reg *prometheus.Registry) (*sdkmetric.MeterProvider, error) {
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)), nil
}
