package sqsdedup_test

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"
)

// failFirstEntry makes the first entry of the next n DeleteMessageBatch
// calls fail behind a success, as SQS can: that entry is not sent, and is
// reported in Failed as a server-side failure.
type failFirstEntry struct {
	left atomic.Int64
	used atomic.Int64
}

func (f *failFirstEntry) times(n int) { f.left.Store(int64(n)) }

func (f *failFirstEntry) hits() int { return int(f.used.Load()) }

func (f *failFirstEntry) take() bool {
	for {
		n := f.left.Load()
		if n <= 0 {
			return false
		}
		if f.left.CompareAndSwap(n, n-1) {
			f.used.Add(1)
			return true
		}
	}
}

func (f *failFirstEntry) APIOption(stack *middleware.Stack) error {
	if stack.ID() != "DeleteMessageBatch" {
		return nil
	}
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("failFirstEntry",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			params, ok := in.Parameters.(*sqs.DeleteMessageBatchInput)
			if !ok || len(params.Entries) == 0 || !f.take() {
				return next.HandleInitialize(ctx, in)
			}
			failed := types.BatchResultErrorEntry{
				Id: params.Entries[0].Id, Code: aws.String("InternalError"), Message: aws.String("injected entry failure"),
			}
			if len(params.Entries) == 1 {
				out := &sqs.DeleteMessageBatchOutput{Failed: []types.BatchResultErrorEntry{failed}}
				return middleware.InitializeOutput{Result: out}, middleware.Metadata{}, nil
			}
			rest := *params
			rest.Entries = params.Entries[1:]
			in.Parameters = &rest
			out, md, err := next.HandleInitialize(ctx, in)
			if res, ok := out.Result.(*sqs.DeleteMessageBatchOutput); ok && err == nil {
				res.Failed = append(res.Failed, failed)
			}
			return out, md, err
		}), middleware.Before)
}

// slowResponse holds back the response of every call of one operation for
// delay, after the service has acted on it: the caller learns late of what
// is already done.
func slowResponse(operation string, delay time.Duration) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		if stack.ID() != operation {
			return nil
		}
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("slowResponse",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				time.Sleep(delay)
				return out, md, err
			}), middleware.Before)
	}
}
