package slotsapi

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/phases/lease"
)

// Every kind of the core's errors has a code of its own, read back as the
// same kind (the CNI adapter reads a status's kind so), and Status keeps
// the core's message; a status passes as it is, a context's end is its
// code, anything else Internal.
func TestStatusTable(t *testing.T) {
	seen := map[codes.Code]lease.Kind{}
	for k := lease.ErrInternal; k <= lease.ErrDeadline; k++ {
		c := Code(k)
		if prev, ok := seen[c]; ok {
			t.Errorf("kinds %v and %v share the code %v", prev, k, c)
		}
		seen[c] = k
		if got := KindOf(c); got != k {
			t.Errorf("KindOf(Code(%v)) = %v", k, got)
		}
		err := fmt.Errorf("wrapped: %w", lease.Errorf(k, "slot %d: why", 3))
		if st := status.Convert(Status(err)); st.Code() != c || st.Message() != "slot 3: why" {
			t.Errorf("Status of a %v error = %v %q", k, st.Code(), st.Message())
		}
	}
	for err, want := range map[error]codes.Code{
		status.Error(codes.ResourceExhausted, "rate"): codes.ResourceExhausted,
		lease.FromContext(context.Canceled):           codes.Canceled,
		context.DeadlineExceeded:                      codes.DeadlineExceeded,
		fmt.Errorf("unclassified"):                    codes.Internal,
	} {
		if got := status.Code(Status(err)); got != want {
			t.Errorf("Status(%v) = %v, want %v", err, got, want)
		}
	}
}
