package group_test

import (
	"reflect"
	"testing"

	"github.com/dedupkit/dedup/internal/group"
)

func TestByKeepsOrder(t *testing.T) {
	got := group.By([]string{"b1", "a1", "b2", "c1", "a2"}, func(s string) byte { return s[0] })
	want := [][]string{{"b1", "b2"}, {"a1", "a2"}, {"c1"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("By: %v, want %v", got, want)
	}
	if got := group.By(nil, func(s string) string { return s }); got != nil {
		t.Errorf("By(nil): %v, want nil", got)
	}
}
