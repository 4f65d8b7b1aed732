// Package deps pins the project's chosen dependencies while their users are written. Temporary.
package deps

import (
	_ "github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/shirou/gopsutil/v4/cpu"
	_ "github.com/shirou/gopsutil/v4/mem"
	_ "github.com/vektah/gqlparser/v2"
	_ "github.com/vektah/gqlparser/v2/parser"
	_ "github.com/vektah/gqlparser/v2/ast"
	_ "go.uber.org/zap"
	_ "go.uber.org/zap/zaptest/observer"
	_ "github.com/andybalholm/brotli"
)
