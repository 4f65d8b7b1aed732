package cascade

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/caddy-cascade/cascade/cost"
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

// provisionMoney sets the Count of each limit given as an amount: in
// micro-units on a money dimension; on any other, the amount must be a
// whole number.
func (h *Handler) provisionMoney() error {
	money := h.moneyDimensions()
	for _, t := range h.trees {
		for _, l := range t.Limits() {
			if l.Amount == "" {
				continue
			}
			if !money[l.Dimension] {
				n, err := strconv.ParseInt(l.Amount, 10, 64)
				if err != nil || n <= 0 {
					return fmt.Errorf("rate_limit: limit %s: amount %q: only a money dimension (one a priced cost counts) takes an amount; give a whole count", l.String(), l.Amount)
				}
				l.Count, l.Amount = n, ""
				continue
			}
			n, err := cost.ParseAmount(strings.ReplaceAll(l.Amount, "_", ""))
			if err == nil && n == 0 {
				err = fmt.Errorf("must be positive")
			}
			if err != nil {
				return fmt.Errorf("rate_limit: limit %s: %w", l.String(), err)
			}
			if l.Burst > 0 {
				return fmt.Errorf("rate_limit: limit %s: a money limit takes no burst: its count is the most that may be spent at once", l.String())
			}
			l.Count = n
		}
	}
	return nil
}
