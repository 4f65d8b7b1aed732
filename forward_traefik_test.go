package cascade

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReportGzip: a report keeps the upstream's Content-Encoding (the
// Traefik plugin sends it), and the endpoint reads a gzip body decoded,
// up to the cost's max_decoded_bytes: a body that decodes past it (a
// decompression bomb) is read no further, and its usage, past the bound,
// is not found. The report's own bytes are bounded by max_report_bytes.
func TestReportGzip(t *testing.T) {
	h, serve := reportEndpoint(t)
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.Bytes()
	}
	usage := `"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`
	small := gz(`{"choices":[],` + usage)
	// 256 KiB of padding before the usage: 4096 bytes or fewer as gzip
	// (max_report_bytes), 4 times the bound set below once decoded.
	bomb := gz(`{"pad":"` + strings.Repeat("a", 256<<10) + `",` + usage)
	if len(bomb) > 4096 {
		t.Fatalf("the bomb is %d bytes of gzip, over max_report_bytes", len(bomb))
	}
	h.Costs[0].Reconcile.MaxDecodedBytes = 64 << 10
	hdr := http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}
	read := func(body []byte) []int64 {
		var got []int64
		for _, u := range h.reportedUsage(&pendingDecision{costs: []int{0}}, hdr, body) {
			got = append(got, u.Actual)
		}
		return got
	}
	if got := read(small); len(got) != 1 || got[0] != 30 {
		t.Fatalf("a gzip report: usage %v, want 30", got)
	}
	if got := read(bomb); len(got) != 0 {
		t.Fatalf("a report decoding past max_decoded_bytes: usage %v, want none", got)
	}
	h.Costs[0].Reconcile.MaxDecodedBytes = 1 << 20
	if got := read(bomb); len(got) != 1 || got[0] != 30 {
		t.Fatalf("the same report within max_decoded_bytes: usage %v, want 30", got)
	}

	// Through the endpoint: decided, then reported gzip, 204.
	id := decideChat(t, serve, "gzip")
	r := httptest.NewRequest("POST", "http://endpoint/report", bytes.NewReader(small))
	r.Header = hdr.Clone()
	r.Header.Set(decisionHeader, id)
	if w := serve(r); w.Code != http.StatusNoContent {
		t.Fatalf("a gzip report: %d %s", w.Code, w.Body)
	}
}
