package dedup

import (
	"context"
	"errors"
	"testing"
	"time"
)

type settleKey struct{}

// A settling write's context keeps its caller's values, not its
// cancellation, and ends at its bound or when released.
func TestBoundedContext(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), settleKey{}, "v"))
	cancelParent()

	ctx, release := bounded(parent, time.Hour)
	if ctx.Value(settleKey{}) != "v" {
		t.Fatal("the caller's values are lost")
	}
	if ctx.Err() != nil || context.Cause(ctx) != nil {
		t.Fatalf("ended with its caller: %v, %v", ctx.Err(), context.Cause(ctx))
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) < 59*time.Minute {
		t.Fatalf("deadline %v, %v; want an hour from now", d, ok)
	}
	done := ctx.Done()
	select {
	case <-done:
		t.Fatal("done before its bound")
	default:
	}
	release()
	<-done
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("released: %v", ctx.Err())
	}
	release() // twice: nothing

	// Released before anyone waited: Done is closed when asked.
	ctx, release = bounded(context.Background(), time.Hour)
	release()
	<-ctx.Done()

	// At the bound, whether Done was asked first or not.
	ctx, release = bounded(context.Background(), time.Millisecond)
	defer release()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("at the bound: %v", ctx.Err())
	}
	ctx2, release2 := bounded(context.Background(), -time.Second)
	defer release2()
	if !errors.Is(ctx2.Err(), context.DeadlineExceeded) {
		t.Fatalf("past the bound, Done never asked: %v", ctx2.Err())
	}
	<-ctx2.Done()

	// A context derived from it ends with it.
	ctx3, release3 := bounded(context.Background(), time.Hour)
	child, cancelChild := context.WithCancel(ctx3)
	defer cancelChild()
	release3()
	<-child.Done()
}

// bounded is withBound with its release as a CancelFunc.
func bounded(ctx context.Context, bound time.Duration) (*boundedContext, func()) {
	c := withBound(ctx, bound)
	return c, c.release
}
