package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// The event order, IDs and payloads every transport's rows are filled
// with, as main's parent.go has them since the RabbitMQ and NATS rows
// (merge note: drop this file when merging with it).

// eventOrder returns the events of records deliveries, by number: each of
// unique events once, then re-sends of random earlier ones, shuffled so that
// copies arrive interleaved. The seed is fixed: every run, and every row's
// transport, sees the same order.
func eventOrder(records, unique int) []int {
	rng := rand.New(rand.NewPCG(1, uint64(records)))
	ids := make([]int, 0, records)
	for i := range unique {
		ids = append(ids, i)
	}
	for len(ids) < records {
		ids = append(ids, rng.IntN(unique))
	}
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids
}

// eventID is event i's ID on every transport.
func eventID(i int) string { return "evt-" + strconv.Itoa(i) }

// eventBody is event i's payload on every transport.
func eventBody(i int) []byte {
	return fmt.Appendf(nil, `{"id":%d,"customer":%d,"cents":%d}`, i, i%997, 100+i%9973)
}
