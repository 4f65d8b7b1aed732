package cascade

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCaddyfilePlans: a tree's plan line and strict_allocation, and its
// tiers' plan blocks, are read into the tree and compile.
func TestCaddyfilePlans(t *testing.T) {
	h, err := parse(t, `rate_limit {
		tree api {
			plan {http.rate_limit.entitlement.customers.plan} default free
			strict_allocation
			tier org {header.X-Org} {
				plan free {
					limit 1000/h
				}
				plan pro {
					limit 50000/h
					limit 5000000 tokens/h
				}
				plan enterprise unlimited
			}
			tier key {header.Authorization} {
				plan free {
					limit 100/h
				}
				plan pro {
					limit 5000/h
				}
				limit 1000/h
			}
			tier agent {header.X-Agent} {
				plan pro {
					limit 1/s
				}
			}
		}
		cost tokens {header.X-Tokens}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	tree := h.Trees[0]
	if tree.PlanKey != "{http.rate_limit.entitlement.customers.plan}" || tree.DefaultPlan != "free" || !tree.StrictAllocation {
		t.Fatalf("tree %+v", tree.Tree)
	}
	org, key := tree.Tiers[0], tree.Tiers[1]
	if len(org.Plans) != 3 || len(org.Plans["pro"].Limits) != 2 || !org.Plans["enterprise"].Unlimited || len(org.Limits) != 0 {
		t.Fatalf("org's plans %+v", org.Plans)
	}
	if len(key.Plans) != 2 || key.Plans["free"].Limits[0].Count != 100 || len(key.Limits) != 1 {
		t.Fatalf("key's plans %+v, limits %v", key.Plans, key.Limits)
	}
	got, _ := json.Marshal(h)
	for _, want := range []string{
		`"plan":"{http.rate_limit.entitlement.customers.plan}","default_plan":"free","strict_allocation":true`,
		`"plans":{"enterprise":{"unlimited":true},"free":{"limits":[{"count":1000,"per":"h"}]},"pro":{"limits":[{"count":50000,"per":"h"},{"count":5000000,"per":"h","dimension":"tokens"}]}}`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("JSON lacks %s\n%s", want, got)
		}
	}
	if err := tree.Compile(); err != nil {
		t.Fatalf("Compile: %v", err)
	}
	if problems := tree.AllocationProblems(); len(problems) != 0 {
		t.Fatalf("allocation problems: %v", problems)
	}
}

// TestCaddyfilePlanErrors: each malformed plan line names its line and the
// fix.
func TestCaddyfilePlanErrors(t *testing.T) {
	tree := func(treeLines, tierLines string) string {
		return "rate_limit {\n tree api {\n" + treeLines + "\n  tier org {header.X-Org} {\n   limit 10/s\n" + tierLines + "\n  }\n }\n}"
	}
	planned := func(tierLines string) string { return tree("  plan {header.X-Plan} default free", tierLines) }
	tests := []struct{ name, input, want string }{
		{"no default", tree("  plan {header.X-Plan}", ""),
			"tree api: plan needs a default: plan {header.X-Plan} default <plan> (the plan of a request whose plan is empty or that no tier lists), at Testfile:3"},
		{"default without its plan", tree("  plan {header.X-Plan} default", ""), "tree api: usage: plan <placeholder> default <plan>, e.g. plan {http.rate_limit.entitlement.customers.plan} default free, at Testfile:3"},
		{"another word than default", tree("  plan {header.X-Plan} fallback free", ""), "tree api: usage: plan <placeholder> default <plan>"},
		{"no arguments", tree("  plan", ""), "tree api: usage: plan <placeholder> default <plan>"},
		{"a constant plan", tree("  plan pro default free", ""), `tree api: plan "pro" is a constant: take a request's plan from a placeholder`},
		{"a plan block in the tree", tree("  plan pro {\n   limit 1/s\n  }", ""), "tree api: a plan's limits belong to a tier: tier <name> <key> { plan <name> { limit ... } }"},
		{"an unlimited plan in the tree", tree("  plan enterprise unlimited", ""), "tree api: a plan's limits belong to a tier"},
		{"plan twice", tree("  plan {header.X-Plan} default free\n  plan {header.X-P} default pro", ""), "tree api: plan given twice: write one line"},
		{"strict_allocation with an argument", tree("  strict_allocation on", ""), `tree api: strict_allocation takes no argument (got "on"), at Testfile:3`},
		{"strict_allocation typo", tree("  strict_alocation", ""), `tree api: unknown option "strict_alocation": did you mean "strict_allocation"?`},
		{"strict_allocation in a tier", planned("   strict_allocation"), "tier org: strict_allocation is not an option here: strict_allocation belongs to the tree"},
		{"a plan without limits", planned("   plan pro"), "tier org: plan pro has no limits: add limit lines in its block, or write plan pro unlimited, at Testfile:6"},
		{"unlimited and limits", planned("   plan pro unlimited {\n    limit 1/s\n   }"), "tier org: plan pro: unlimited and limits are exclusive"},
		{"a plan twice", planned("   plan pro unlimited\n   plan pro {\n    limit 1/s\n   }"), "tier org: plan pro given twice: give each plan one block, at Testfile:7"},
		{"a tier's plan without a name", planned("   plan"), "tier org: usage: plan <name> { limit ... } or plan <name> unlimited, one plan a line, at Testfile:6"},
		{"two plans on a line", planned("   plan free pro {\n    limit 1/s\n   }"), "tier org: usage: plan <name> { limit ... } or plan <name> unlimited, one plan a line"},
		{"the tree's plan line in a tier", planned("   plan {header.X-Plan} default free"), "tier org: plan {header.X-Plan} default free belongs to the tree: tree api { plan {header.X-Plan} default free ... }"},
		{"not a limit in a plan", planned("   plan pro {\n    value x\n   }"), `plan pro: unknown option "value" (expected limit), at Testfile:7`},
		{"a bad limit in a plan", planned("   plan pro {\n    limit 0/s\n   }"), `limit: count "0" must be a positive whole number`},
		{"a dimension without cost in a plan", planned("   plan pro {\n    limit 5 tokens/s\n   }"), "tree api counts tokens, but no cost says what a request costs in tokens"},
		{"plan blocks without the tree's plan", tree("", "   plan pro {\n    limit 1/s\n   }"),
			"tree api: tier org has plan blocks, but the tree does not say where a request's plan comes from: add plan <placeholder> default <plan> to the tree, at Testfile:2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.input)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v\nwant it to contain %s\n%s", err, tt.want, tt.input)
			}
		})
	}
}
