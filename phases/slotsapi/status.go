package slotsapi

import (
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/phases/lease"
)

// codeOf is the gRPC code of each kind of the lease core's errors: the one
// table of the Slots API's answers (the CNI adapter and the held slots'
// routes read it too, for the guard's audit line and an HTTP status).
var codeOf = [...]codes.Code{
	lease.ErrInternal:        codes.Internal,
	lease.ErrInvalid:         codes.InvalidArgument,
	lease.ErrUnauthenticated: codes.Unauthenticated,
	lease.ErrDenied:          codes.PermissionDenied,
	lease.ErrNotFound:        codes.NotFound,
	lease.ErrExists:          codes.AlreadyExists,
	lease.ErrExhausted:       codes.ResourceExhausted,
	lease.ErrPrecondition:    codes.FailedPrecondition,
	lease.ErrAborted:         codes.Aborted,
	lease.ErrUnavailable:     codes.Unavailable,
	lease.ErrCanceled:        codes.Canceled,
	lease.ErrDeadline:        codes.DeadlineExceeded,
}

// Code is the gRPC code of an error of kind k.
func Code(k lease.Kind) codes.Code {
	if int(k) < len(codeOf) {
		return codeOf[k]
	}
	return codes.Internal
}

// Status returns err as a gRPC status error: a status already (the
// guard's refusals, control.Charge's) as it is, an error of the lease
// core with its kind's code and its message, anything else Internal.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var le *lease.Error
	if errors.As(err, &le) {
		return status.Error(Code(le.Kind), le.Msg)
	}
	return status.Error(Code(lease.KindOf(err)), err.Error())
}

// HTTPStatus is the HTTP status of an answer with gRPC code c, on the
// control socket's JSON routes (the CNI plugin's, the held slots'): for a
// human with curl; the callers read the code in the body.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled, codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// KindOf is the kind of an answer with gRPC code c: the table read
// backwards (a code of no kind's is ErrInternal).
func KindOf(c codes.Code) lease.Kind {
	for k, v := range codeOf {
		if v == c {
			return lease.Kind(k)
		}
	}
	return lease.ErrInternal
}

// Convert returns err as a gRPC status (see [Status]).
func Convert(err error) *status.Status { return status.Convert(Status(err)) }
