package admin

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/spf13/cobra"
)

// uiRoutes are the admin routes the status page reads: the only ones
// `caddy rate-limit ui` passes on, and only to read them.
var uiRoutes = []string{
	"/rate_limit/ui", "/rate_limit/ui/app.js", "/rate_limit/ui/app.css",
	"/rate_limit/trees", "/rate_limit/top", "/rate_limit/overrides", "/rate_limit/entitlements", "/rate_limit/status",
}

// uiCommand serves the status page on a loopback address. Caddy's admin
// endpoint refuses a browser's navigation (it checks the origin of every
// request a browser marks, and a typed address has none), so a browser
// cannot open /rate_limit/ui there; this command passes the page's
// requests on as a client's, reading only.
func uiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ui [--listen 127.0.0.1:2020]",
		Short: "Serves the status page for a browser, on a loopback address (read only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			listen, _ := cmd.Flags().GetString("listen")
			if err := loopback(listen); err != nil {
				return err
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			defer l.Close()
			token := rand.Text() // other local users reach the loopback address too
			h, err := uiProxy(c.address, l.Addr().(*net.TCPAddr).Port, token)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(shut)
			}()
			fmt.Fprintf(c.out, "The status page: http://%s/rate_limit/ui?token=%s (Ctrl-C to stop)\n", l.Addr(), token)
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().String("listen", "127.0.0.1:2020", "The loopback address to serve the page on")
	return cmd
}

// loopback refuses an address that is not a loopback one: the page shows
// what the admin endpoint does, to whoever can reach it.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: serve the page on a loopback address (127.0.0.1, ::1): it shows what the admin endpoint does to whoever reaches it", addr)
	}
	return nil
}

// uiProxy passes the status page's requests on to the admin endpoint at
// address: GET and HEAD of uiRoutes only, stripped of what a browser adds
// (Origin, Referer, Sec-Fetch-*), so that Caddy sees a client's request. A
// request another site makes is refused, and so is one for another host
// than the loopback one on port (a DNS name rebound to 127.0.0.1 would
// make another site's page same-origin with this one).
//
// Only a browser that opened the address the command printed (with its
// token, kept in a cookie from then on) is served: other local users
// reach the loopback address too.
func uiProxy(address string, port int, token string) (http.Handler, error) {
	target, transport, err := adminTarget(address)
	if err != nil {
		return nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			for _, h := range []string{"Origin", "Referer", "Sec-Fetch-Mode", "Sec-Fetch-Site", "Sec-Fetch-Dest", "Sec-Fetch-User", "Cookie"} {
				pr.Out.Header.Del(h)
			}
		},
		Transport: transport,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !loopbackHost(r.Host, port):
			http.Error(w, "open the status page at 127.0.0.1 or localhost", http.StatusMisdirectedRequest)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			http.Error(w, "the status page only reads: use the admin API or the other commands to change anything", http.StatusMethodNotAllowed)
		case r.URL.Query().Get("token") != "":
			if subtle.ConstantTimeCompare([]byte(r.URL.Query().Get("token")), []byte(token)) != 1 {
				http.Error(w, "not the token `caddy rate-limit ui` printed", http.StatusForbidden)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, r.URL.Path, http.StatusFound)
		case !hasToken(r, token):
			http.Error(w, "open the address `caddy rate-limit ui` printed (with its token)", http.StatusForbidden)
		case r.Header.Get("Sec-Fetch-Site") == "cross-site" || r.Header.Get("Sec-Fetch-Site") == "same-site":
			http.Error(w, "not from another site", http.StatusForbidden)
		case r.URL.Path == "/":
			http.Redirect(w, r, "/rate_limit/ui", http.StatusFound)
		case !slices.Contains(uiRoutes, r.URL.Path):
			http.Error(w, "not a route of the status page", http.StatusNotFound)
		default:
			proxy.ServeHTTP(w, r)
		}
	}), nil
}

// uiCookie keeps the token of `caddy rate-limit ui` in the browser.
const uiCookie = "cascade_ui"

// hasToken reports whether r bears the token in its cookie.
func hasToken(r *http.Request, token string) bool {
	c, err := r.Cookie(uiCookie)
	return err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(token)) == 1
}

// loopbackHost reports whether a request's Host names this machine's
// loopback on port: localhost, or a loopback address.
func loopbackHost(host string, port int) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != strconv.Itoa(port) {
		return false
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// adminTarget is the URL and transport that reach the admin endpoint at
// address, as caddy's own commands reach it (a TCP address or a Unix
// socket).
func adminTarget(address string) (*url.URL, http.RoundTripper, error) {
	na, err := caddy.ParseNetworkAddress(address)
	if err != nil || na.PortRangeSize() > 1 {
		return nil, nil, fmt.Errorf("the admin address %q: not one address (%v)", address, err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	if na.IsUnixNetwork() {
		path, _, _ := strings.Cut(na.Host, "|") // less the socket's permission bits
		t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}
		return &url.URL{Scheme: "http", Host: "127.0.0.1"}, t, nil
	}
	return &url.URL{Scheme: "http", Host: na.JoinHostPort(0)}, t, nil
}
