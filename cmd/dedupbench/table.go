package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// printTable writes the results as an aligned table.
func printTable(w io.Writer, rs []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tN\tevents/s\tvs floor\tstore calls/ev\tSQS calls/ev\tp50 added\tp99 added\tallocs/ev\tpeak RSS\tclient CPU/ev\tPG CPU/ev\t")
	for _, r := range rs {
		if strings.HasPrefix(r.Check, "FAILED") {
			fmt.Fprintf(tw, "%s\t%d\t%s\t\t\t\t\t\t\t\t\t\t\n", r.Title, r.Records, "failed")
			continue
		}
		sqs := "-"
		if r.SQSPerEvent > 0 {
			sqs = fmt.Sprintf("%.3f", r.SQSPerEvent)
		}
		ratio := "-"
		if r.RatioToFloor > 0 {
			ratio = fmt.Sprintf("%.2fx", r.RatioToFloor)
		}
		pgCPU := "-"
		if r.PGCPUMicros > 0 {
			pgCPU = micros(r.PGCPUMicros)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.3f\t%s\t%s\t%s\t%.1f\t%.0f MiB\t%s\t%s\t\n",
			r.Title, r.Records, thousands(r.EventsPerSec), ratio, r.StorePerEvent, sqs,
			micros(r.P50Micros), micros(r.P99Micros), r.AllocsPerEvent, r.PeakRSSMiB, micros(r.ClientCPUMicros), pgCPU)
	}
	tw.Flush()
}

func micros(us float64) string {
	switch {
	case us >= 10_000:
		return fmt.Sprintf("%.0f ms", us/1000)
	case us >= 1000:
		return fmt.Sprintf("%.1f ms", us/1000)
	case us >= 10:
		return fmt.Sprintf("%.0f µs", us)
	default:
		return fmt.Sprintf("%.1f µs", us)
	}
}

// thousands formats v rounded, with thousands separators.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
