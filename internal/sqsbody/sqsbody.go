// Package sqsbody keeps the answers of SQS calls made on a fast endpoint or
// a loaded machine from being thrown away and their calls made again: the
// receive of sqsdedup, the sends of sqsoutbox, the redrive of the dedup
// command and dedupbench use it.
package sqsbody

import (
	"context"
	"io"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// KeepConnection is an SQS client or per-call option that keeps a fast
// answer from being thrown away, and its call made again.
//
// The SDK (smithy-go's transport) closes a request's body as soon as the
// response's headers are in, and the wrapper it sends the body in then
// answers WriteTo with io.EOF. net/http, once it has written a body of known
// length, drains what is left of it with io.Copy, which uses WriteTo: when
// the goroutine writing the request is descheduled between the last byte and
// that check, long enough for the server to answer (a local endpoint, a
// loaded machine), the check runs after the close, takes the io.EOF for a
// failed write and closes the connection under the response being read. The
// call fails with "use of closed network connection" and the SDK retries it.
// Harmless for a delete, this is a loss for a receive: the messages of the
// first answer are in flight and nobody holds them, so they come back only
// when their visibility timeout runs out.
//
// Sending the body without WriteTo makes the check read instead, and a read
// of the closed body is a plain end of stream.
func KeepConnection(o *sqs.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Finalize.Add(readOnlyBody{}, middleware.After)
	})
}

// readOnlyBody hides the io.WriterTo of a request's body, keeping the rest
// of it (io.Seeker, for the retries' rewinding and the length).
type readOnlyBody struct{}

func (readOnlyBody) ID() string { return "sqsbody.readOnlyBody" }

func (readOnlyBody) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (
	middleware.FinalizeOutput, middleware.Metadata, error,
) {
	if req, ok := in.Request.(*smithyhttp.Request); ok {
		if s, ok := req.GetStream().(io.ReadSeeker); ok {
			if _, ok := s.(io.WriterTo); ok {
				rc, err := req.SetStream(readSeeker{s})
				if err != nil {
					return middleware.FinalizeOutput{}, middleware.Metadata{}, err
				}
				in.Request = rc
			}
		}
	}
	return next.HandleFinalize(ctx, in)
}

// readSeeker is an io.ReadSeeker and nothing else.
type readSeeker struct{ io.ReadSeeker }
