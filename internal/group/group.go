// Package group splits a batch into the runs whose order a transport keeps:
// the messages of an SQS FIFO message group, the outbox events of one key.
package group

// By splits items by key, keeping their order within each group and the
// groups in the order of their first item.
func By[T any, K comparable](items []T, key func(T) K) [][]T {
	var out [][]T
	index := make(map[K]int)
	for _, it := range items {
		k := key(it)
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], it)
	}
	return out
}
