package cascade

import (
	"context"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// chargedNext is the next handler of a request admitted under charge_on:
// it sees the response's status and headers as they are written and, when
// they do not match, gives back everything the request was charged.
type chargedNext struct {
	h    *Handler
	d    *decision
	next caddyhttp.Handler
}

func (c chargedNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	cw := &chargeWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		c: c, ctx: context.WithoutCancel(r.Context())}
	err := c.next.ServeHTTP(cw, r)
	if !cw.settled {
		// Nothing was written: the status is the error's (which Caddy's
		// error handling writes once the handlers return), or 200.
		code := http.StatusOK
		if err != nil {
			code = errorStatus(err, http.StatusInternalServerError)
		}
		cw.settle(code)
	}
	return err
}

// chargeWriter settles charge_on when the response's final status is
// written: before the response leaves, so that the client's next request
// finds what a response that did not count gave back.
type chargeWriter struct {
	*caddyhttp.ResponseWriterWrapper
	c       chargedNext
	ctx     context.Context // the request's, never cancelled: a client gone still gets its refund
	settled bool
}

func (w *chargeWriter) WriteHeader(code int) {
	if !w.settled && (code >= 200 || code == http.StatusSwitchingProtocols) { // not an informational 1xx
		w.settle(code)
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *chargeWriter) Write(b []byte) (int, error) {
	if !w.settled {
		w.settle(http.StatusOK)
	}
	return w.ResponseWriterWrapper.Write(b)
}

func (w *chargeWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.settled {
		w.settle(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// settle gives back the request's charges unless the response matches.
func (w *chargeWriter) settle(code int) {
	w.settled = true
	h, d := w.c.h, w.c.d
	if h.ChargeOn.Match(code, w.Header()) {
		return
	}
	d.refunded = true
	if err := d.RefundServed(w.ctx); err != nil {
		h.logger.Warn("charge_on: giving back the charge of a response that does not count failed; it stays charged",
			zap.Int("status", code), zap.Error(h.engine.ShowError(err, d.Buckets)))
	}
}
