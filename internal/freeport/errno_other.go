//go:build !unix

package freeport

import "errors"

var errAddrInUse = errors.New("address already in use")
