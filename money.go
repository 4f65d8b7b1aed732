package cascade

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// A money dimension is one that a priced cost counts (cost usd llm { price
// … }): its limits are amounts of a currency, counted in micro-units (1 usd
// = 1,000,000) wherever an integer is needed.

// moneyDimensions are the dimensions the handler's priced costs count.
func (h *Handler) moneyDimensions() map[string]bool {
	var money map[string]bool
	for _, c := range h.Costs {
		if c.Pricing != nil {
			if money == nil {
				money = map[string]bool{}
			}
			money[c.Dimension] = true
		}
	}
	return money
}

// eachLimit calls f with every limit of trees: their tiers' and their
// values' overrides'.
func eachLimit(trees []*Tree, f func(*hierarchy.Limit)) {
	for _, t := range trees {
		for _, tier := range t.Tiers {
			for _, l := range tier.Limits {
				f(l)
			}
			for _, o := range tier.Values {
				for _, l := range o.Limits {
					f(l)
				}
			}
		}
	}
}

// provisionMoney sets the Count of each limit given as an amount: in
// micro-units on a money dimension; on any other, the amount must be a
// whole number.
func (h *Handler) provisionMoney() error {
	money := h.moneyDimensions()
	var err error
	eachLimit(h.trees, func(l *hierarchy.Limit) {
		if l.Amount == "" || err != nil {
			return
		}
		if !money[l.Dimension] {
			n, perr := strconv.ParseInt(l.Amount, 10, 64)
			if perr != nil || n <= 0 {
				err = fmt.Errorf("rate_limit: limit %s: amount %q: only a money dimension (one a priced cost counts) takes an amount; give a whole count", l.String(), l.Amount)
				return
			}
			l.Count, l.Amount = n, ""
			return
		}
		n, perr := cost.ParseAmount(strings.ReplaceAll(l.Amount, "_", ""))
		if perr == nil && n == 0 {
			perr = fmt.Errorf("must be positive")
		}
		if perr != nil {
			err = fmt.Errorf("rate_limit: limit %s: %w", l.String(), perr)
			return
		}
		if l.Burst > 0 {
			err = fmt.Errorf("rate_limit: limit %s: a money limit takes no burst: its count is the most that may be spent at once", l.String())
			return
		}
		l.Count = n
	})
	return err
}
