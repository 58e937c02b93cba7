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
	fmt.Fprintln(tw, "row\tN\ttable\tevents/s\tvs floor\tstore calls/ev\tSQS calls/ev\tp50 added\tp99 added\tp99 claim\tallocs/ev\tpeak RSS\tclient CPU/ev\tPG CPU/ev\tbytes/M rec\t")
	for _, r := range rs {
		title := r.Title
		if r.PurgeExpired > 0 {
			title += fmt.Sprintf(", during Purge of %s expired (%.0fs)", thousands(float64(r.PurgeExpired)), r.PurgeSeconds)
		}
		size := "-"
		if r.TableShape != "" {
			size = thousands(float64(r.TableRecords)) + " " + r.TableShape
		}
		if strings.HasPrefix(r.Check, "FAILED") {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\n", title, r.Records, size, "failed")
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
		claim, bytes := "-", "-"
		if r.P99ClaimMicros > 0 {
			claim = micros(r.P99ClaimMicros)
		}
		if r.TableBytesPerMillion > 0 {
			bytes = fmt.Sprintf("%.0f MiB", r.TableBytesPerMillion/(1<<20))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%.1f\t%.0f MiB\t%s\t%s\t%s\t\n",
			title, r.Records, size, thousands(r.EventsPerSec), ratio, r.StorePerEvent, sqs,
			micros(r.P50Micros), micros(r.P99Micros), claim, r.AllocsPerEvent, r.PeakRSSMiB, micros(r.ClientCPUMicros), pgCPU, bytes)
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

// purgeMark marks a purge row's name in the progress lines.
func purgeMark(purge int) string {
	if purge > 0 {
		return "+purge"
	}
	return ""
}
