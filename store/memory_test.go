package store_test

import (
	"testing"

	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock store.Clock) store.Store {
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	})
}
