package provider

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// DispatchState is what the caller observed of one call that leaves the process. It says what the caller saw,
// never more: only the provider's records (Lookup) say what the provider did.
type DispatchState string

const (
	// DispatchNotSent: no connection was ever established (refused, DNS, TLS, or the deadline passed first).
	// Nothing reached the provider; sending again with the same key is safe.
	DispatchNotSent DispatchState = "not_sent"
	// DispatchSentNoResponse: a connection carried (some of) the request and no usable answer came back: a
	// timeout, a reset after the write, a body cut short. The call may or may not have executed.
	DispatchSentNoResponse DispatchState = "sent_no_response"
	// DispatchResponseReceived: an answer came back, whatever its status.
	DispatchResponseReceived DispatchState = "response_received"
	// DispatchExecutionError: this process failed to carry out the call before anything was sent (the request
	// could not be built).
	DispatchExecutionError DispatchState = "execution_error"
)

// Dispatch reasons: the fixed list a Dispatch.Reason comes from (opstatus's, shared by every downstream). The
// error text goes to logs, not records.
const (
	ReasonConnectionRefused     = opstore.ReasonConnectionRefused
	ReasonDNSFailure            = opstore.ReasonDNSFailure
	ReasonTLSFailure            = opstore.ReasonTLSFailure
	ReasonConnectTimeout        = opstore.ReasonConnectTimeout
	ReasonConnectFailed         = opstore.ReasonConnectFailed
	ReasonTimeout               = opstore.ReasonTimeout
	ReasonConnectionReset       = opstore.ReasonConnectionReset
	ReasonConnectionClosed      = opstore.ReasonConnectionClosed
	ReasonCancelled             = opstore.ReasonCancelled
	ReasonNoResponse            = opstore.ReasonNoResponse
	ReasonResponseCut           = opstore.ReasonResponseCut
	ReasonRequestNotBuilt       = opstore.ReasonRequestNotBuilt
	ReasonEvidenceNotRecorded   = opstore.ReasonEvidenceNotRecorded
	ReasonResponseNotUnderstood = opstore.ReasonResponseNotUnderstood
)

// Dispatch is the record of one call that carries an idempotency key.
type Dispatch struct {
	State  DispatchState `json:"state"`
	Method string        `json:"method"`
	Path   string        `json:"path"`
	Key    string        `json:"downstream_key"`
	Reason string        `json:"reason,omitempty"`
	// Status, RemoteRef (the id the provider gave), BodySHA256 and Replayed (the provider said it answered
	// from an earlier call's stored answer) are set when a response was received.
	Status     int    `json:"status,omitempty"`
	RemoteRef  string `json:"remote_ref,omitempty"`
	BodySHA256 string `json:"body_sha256,omitempty"`
	Replayed   bool   `json:"replayed"`
}

// DispatchObserver records the calls a Client makes with an idempotency key. Started runs before the request
// is written: if it fails the call is not sent (ErrNotSent). Finished runs once with what happened.
type DispatchObserver interface {
	Started(ctx context.Context, d Dispatch) error
	Finished(ctx context.Context, d Dispatch)
}

type observerKey struct{}

// WithDispatchObserver makes the Client report to obs the keyed calls made with the returned context.
func WithDispatchObserver(ctx context.Context, obs DispatchObserver) context.Context {
	return context.WithValue(ctx, observerKey{}, obs)
}

func observerFrom(ctx context.Context) DispatchObserver {
	obs, _ := ctx.Value(observerKey{}).(DispatchObserver)
	return obs
}

// ErrNotSent reports a call that never left this process: nothing executed, and sending it again with the
// same key is safe. It is not ErrOutcomeUnknown.
var ErrNotSent = errors.New("provider: call not sent")

// notSentReason classifies an error of a call whose connection was never established.
func notSentReason(err error) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var recordErr tls.RecordHeaderError
	switch {
	case errors.As(err, &dnsErr):
		return ReasonDNSFailure
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonConnectionRefused
	case errors.As(err, &certErr), errors.As(err, &unknownAuth), errors.As(err, &recordErr):
		return ReasonTLSFailure
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return ReasonConnectTimeout
	case errors.Is(err, context.Canceled):
		return ReasonCancelled
	}
	return ReasonConnectFailed
}

// sentReason classifies an error of a call whose request went out on a connection.
func sentReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return ReasonTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ReasonConnectionReset
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ReasonConnectionClosed
	case errors.Is(err, context.Canceled):
		return ReasonCancelled
	}
	return ReasonNoResponse
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// received fills the response fields of d.
func received(d Dispatch, status int, replayed bool, body []byte) Dispatch {
	d.State, d.Status, d.Replayed = DispatchResponseReceived, status, replayed
	sum := sha256.Sum256(body)
	d.BodySHA256 = hex.EncodeToString(sum[:])
	var ref struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &ref) == nil {
		d.RemoteRef = ref.ID
	}
	return d
}
