package engine

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// Fingerprints turns the values of sensitive tiers (hierarchy.Tier.
// IsSensitive) into what logs and the admin API show instead: "fp:" and
// 12 hex digits of HMAC-SHA256(secret, escaped value). The escaped value
// (hierarchy.Escape, as in a bucket's key) is what is hashed, so that a
// value read back from a storage key, even one hashed there for its length,
// fingerprints as the value itself does. Instances that share the secret
// show the same fingerprint for the same value.
//
// A fingerprint is computed only when a value is written out (a log line,
// an admin answer), never to decide a request.
type Fingerprints struct {
	secret atomic.Pointer[[]byte]
	load   func(context.Context) ([]byte, error)
	logger *zap.Logger

	mu    sync.Mutex // orders loads
	tried time.Time  // when a load last failed
}

// Unknown is what a sensitive value shows as while the secret cannot be
// read: never the value.
const Unknown = FingerprintPrefix + "unknown"

// FingerprintPrefix begins every fingerprint.
const FingerprintPrefix = "fp:"

// NewFingerprints returns fingerprints under secret, or, when secret is
// empty, under the secret load returns (the store's, shared by every
// instance; see store.FingerprintSecret), read when first needed and
// retried at most once a second while it fails. With neither, the secret
// is random, this process's own.
func NewFingerprints(secret []byte, load func(context.Context) ([]byte, error), logger *zap.Logger) *Fingerprints {
	if logger == nil {
		logger = zap.NewNop()
	}
	f := &Fingerprints{load: load, logger: logger}
	switch {
	case len(secret) > 0:
		s := append([]byte(nil), secret...)
		f.secret.Store(&s)
	case load == nil:
		s := processSecret()
		f.secret.Store(&s)
	}
	return f
}

var (
	processOnce sync.Once
	process     []byte
)

// processSecret is a random secret, the same for every Fingerprints of
// this process that has no other.
func processSecret() []byte {
	processOnce.Do(func() {
		process = make([]byte, 32)
		if _, err := rand.Read(process); err != nil {
			panic(err) // crypto/rand does not fail on supported platforms
		}
	})
	return process
}

// Load reads the secret if it is not known yet; it returns an error when
// it cannot (and Of shows Unknown meanwhile). One caller reads at a time;
// the others do not wait for it (a read may take the store's timeout, and
// callers include a request's first denial): they are told it is being
// read.
func (f *Fingerprints) Load(ctx context.Context) error {
	if f.secret.Load() != nil {
		return nil
	}
	if !f.mu.TryLock() {
		return errors.New("the fingerprint secret is being read")
	}
	defer f.mu.Unlock()
	if f.secret.Load() != nil {
		return nil
	}
	if !f.tried.IsZero() && time.Since(f.tried) < time.Second {
		return errors.New("reading the fingerprint secret failed less than a second ago")
	}
	s, err := f.load(ctx)
	if err == nil && len(s) == 0 {
		err = errors.New("the store holds an empty fingerprint secret")
	}
	if err != nil {
		f.tried = time.Now()
		f.logger.Warn("rate limit: the fingerprint secret cannot be read: sensitive values show as "+Unknown, zap.Error(err))
		return err
	}
	f.secret.Store(&s)
	return nil
}

// Of returns the fingerprint of an escaped value (hierarchy.Escape).
func (f *Fingerprints) Of(escaped string) string {
	if f.secret.Load() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		f.Load(ctx)
		cancel()
	}
	s := f.secret.Load()
	if s == nil {
		return Unknown
	}
	m := hmac.New(sha256.New, *s)
	m.Write([]byte(escaped))
	return FingerprintPrefix + hex.EncodeToString(m.Sum(nil)[:6])
}

// Value returns the fingerprint of a value as resolved (unescaped).
func (f *Fingerprints) Value(v string) string { return f.Of(hierarchy.Escape(v)) }

// Show is what logs and the admin API show of value v of tier: v, or its
// fingerprint when the tier is sensitive.
func (e *Engine) Show(tier *hierarchy.Tier, v string) string {
	if tier == nil || !tier.IsSensitive() {
		return v
	}
	return e.cfg.Fingerprints.Value(v)
}

// showValue is Show for the runtime state's logs (control.ValueShower),
// which name trees and tiers.
func (e *Engine) showValue(tree, tier, value string) (string, bool) {
	t := e.Tree(tree)
	if t == nil {
		return "", false
	}
	tr, _ := t.Tier(tier)
	if tr == nil {
		return e.cfg.Fingerprints.Value(value), true // not a tier of ours: not shown raw
	}
	return e.Show(tr, value), true
}

// ShowKey is what logs and the admin API show of a storage key (or of a
// prefix of one, as the top-K sketch keeps): the key, with the values of
// sensitive tiers fingerprinted. A key of a tree the engine does not have
// has every value fingerprinted, and so has a segment of a tier its tree
// does not have (another handler's tree of the same name).
func (e *Engine) ShowKey(key string) string {
	name := ""
	if rest, ok := strings.CutPrefix(key, "{"); ok {
		name, _, _ = strings.Cut(rest, "|")
	}
	t := e.Tree(name)
	if t == nil {
		t = &Tree{Tree: &hierarchy.Tree{Name: name}}
	}
	return t.RedactKey(key, e.cfg.Fingerprints.Of)
}

// ShowError returns err, or when its message holds a value of a sensitive
// tier among buckets (as resolved or escaped), an error whose message has
// it fingerprinted instead: store errors may quote a bucket's key. errors.Is
// and As still see err.
func (e *Engine) ShowError(err error, buckets []hierarchy.Bucket) error {
	if err == nil {
		return nil
	}
	msg := e.showKeys(err.Error())
	changed := msg != err.Error()
	for _, b := range buckets {
		if b.Tier == nil || !b.Tier.IsSensitive() || b.Value == "" {
			continue
		}
		esc := hierarchy.Escape(b.Value)
		for _, s := range []string{b.Value, esc} {
			if strings.Contains(msg, s) {
				msg = strings.ReplaceAll(msg, s, e.cfg.Fingerprints.Of(esc))
				changed = true
			}
		}
	}
	if !changed {
		return err
	}
	return &shownError{msg: msg, err: err}
}

// showKeys fingerprints the sensitive values of the storage keys that a
// text quotes: every run of key characters from "{<tree>|" of a tree with
// a sensitive tier.
func (e *Engine) showKeys(msg string) string {
	for _, t := range e.cfg.Trees {
		if !t.Sensitive() {
			continue
		}
		head := "{" + t.Name + "|"
		for from := 0; ; {
			i := strings.Index(msg[from:], head)
			if i < 0 {
				break
			}
			i += from
			j := i + len(head)
			for j < len(msg) && keyChar(msg[j]) {
				j++
			}
			shown := t.RedactKey(msg[i:j], e.cfg.Fingerprints.Of)
			msg = msg[:i] + shown + msg[j:]
			from = i + len(shown)
		}
	}
	return msg
}

// keyChar tells whether c may appear in a storage key: an escaped value's
// characters (hierarchy.Escape) and the key's separators.
func keyChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.@:+%~{}|=/#", c) >= 0
}

// shownError is an error whose message has sensitive values fingerprinted.
type shownError struct {
	msg string
	err error
}

func (s *shownError) Error() string { return s.msg }
func (s *shownError) Unwrap() error { return s.err }
