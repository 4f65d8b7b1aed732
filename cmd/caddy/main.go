// Command caddy is Caddy with the Cascade rate limiter built in, so that
// `go run ./cmd/caddy run --config examples/quickstart/Caddyfile` works
// without xcaddy. It is what `xcaddy build --with github.com/caddy-cascade/cascade`
// produces.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-cascade/cascade"
)

func main() {
	caddycmd.Main()
}
