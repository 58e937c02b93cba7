package dedupui

import (
	"fmt"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/outbox"
)

// The geometry of a chart, in SVG units: one bar per minute of the window.
const (
	chartWidth  = 600
	chartHeight = 120
	minutes     = int(window / time.Minute)
	barWidth    = chartWidth / minutes
	reasonKinds = 6 // colours of reasons, cycled
)

// chart is a bar chart of counts per minute over the window, drawn as
// inline SVG by the layout's "chart" template: no script, no fetch.
type chart struct {
	Title, Empty  string
	Width, Height int
	Bars          []bar
	Legend        []legend
	Max           int64
	From, To      string
	Total         int64
}

// bar is one rectangle of a chart; Tip is its tooltip.
type bar struct {
	X, Y, W, H int
	Class, Tip string
}

// legend names a reason's colour.
type legend struct {
	Class, Reason string
	Count         int64
}

// series is one stack of a chart: a count per minute of the window.
type series struct {
	name   string
	counts [minutes]int64
}

// newChart draws the stacked series over the window ending at now.
func newChart(title, empty string, now time.Time, stacks []series) chart {
	c := chart{Title: title, Empty: empty, Width: chartWidth, Height: chartHeight,
		From: stamp(now.Add(-window)), To: stamp(now)}
	var sums [minutes]int64
	for _, s := range stacks {
		for i, n := range s.counts {
			sums[i] += n
			c.Total += n
		}
	}
	for _, n := range sums {
		c.Max = max(c.Max, n)
	}
	if c.Max == 0 {
		return c
	}
	var base [minutes]int
	for k, s := range stacks {
		class := fmt.Sprintf("r%d", k%reasonKinds)
		var total int64
		for i, n := range s.counts {
			if n == 0 {
				continue
			}
			total += n
			h := max(1, int(n*chartHeight/c.Max))
			base[i] += h
			c.Bars = append(c.Bars, bar{X: i * barWidth, Y: chartHeight - base[i], W: barWidth - 1, H: h, Class: class,
				Tip: fmt.Sprintf("%s: %d at %s", s.name, n, now.Add(-window).Add(time.Duration(i)*time.Minute).UTC().Format("15:04"))})
		}
		if len(stacks) > 1 || s.name != "" {
			c.Legend = append(c.Legend, legend{Class: class, Reason: s.name, Count: total})
		}
	}
	return c
}

// slot is the bar of minute m in the window ending at now, or -1 outside.
func slot(now, m time.Time) int {
	i := int(m.Sub(now.Add(-window)) / time.Minute)
	if i < 0 || i >= minutes {
		return -1
	}
	return i
}

// failureChart charts the failures by reason.
func failureChart(now time.Time, counts []dedup.ReasonCount) chart {
	var stacks []series
	index := map[string]int{}
	for _, rc := range counts {
		i, ok := index[rc.Reason]
		if !ok {
			i = len(stacks)
			index[rc.Reason] = i
			stacks = append(stacks, series{name: rc.Reason})
		}
		if j := slot(now, rc.Minute); j >= 0 {
			stacks[i].counts[j] += rc.Count
		}
	}
	return newChart("Failures by reason, per minute", "no failure in the last hour", now, stacks)
}

// minuteChart charts one count per minute.
func minuteChart(title, empty string, now time.Time, at []time.Time, counts []int64) chart {
	var s series
	for i, m := range at {
		if j := slot(now, m); j >= 0 {
			s.counts[j] += counts[i]
		}
	}
	return newChart(title, empty, now, []series{s})
}

// writtenChart charts the records written per minute.
func writtenChart(now time.Time, counts []dedup.MinuteCount) chart {
	at, n := make([]time.Time, len(counts)), make([]int64, len(counts))
	for i, m := range counts {
		at[i], n[i] = m.Minute, m.Count
	}
	return minuteChart("Records written per minute", "no record written in the last hour", now, at, n)
}

// publishedChart charts the outbox events published per minute.
func publishedChart(now time.Time, counts []outbox.PublishedMinute) chart {
	at, n := make([]time.Time, len(counts)), make([]int64, len(counts))
	for i, m := range counts {
		at[i], n[i] = m.Minute, m.Count
	}
	return minuteChart("Events published per minute", "no event published in the last hour (or the relay deletes what it sends)", now, at, n)
}
