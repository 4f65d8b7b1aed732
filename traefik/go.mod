module github.com/caddy-cascade/cascade/traefik

go 1.22
