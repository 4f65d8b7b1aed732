package admin

// The `caddy rate-limit` command: a client of the admin API above, through
// Caddy's own admin client (caddycmd.AdminAPIRequest), so that unix
// sockets, the Origin header and the --config address discovery work as
// they do for `caddy reload` and `caddy stop`.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// synopsis is the usage of `caddy rate-limit`.
const synopsis = `caddy rate-limit trees
caddy rate-limit inspect <tree> <tier>=<value>... [--cost N] [--cost-in <dimension>=N]...
caddy rate-limit reset <tree> <tier>=<value>... [--below]
caddy rate-limit override set <tree> <tier> <value> (--limit "<limit>"... | --unlimited) [--expires <RFC 3339> | --for <duration>] [--note "who and why"]
caddy rate-limit override delete <tree> <tier> <value>
caddy rate-limit override list
caddy rate-limit mode <tree> enforce|warn|shadow [--note "who and why"]
caddy rate-limit mode <tree> --reset
caddy rate-limit entitlements set <name> <value> [--plan <plan>] [--limit "<limit>"]... [--expires <RFC 3339 or duration> | --for <duration>] [--note "who and why"]
caddy rate-limit entitlements delete <name> <value>
caddy rate-limit entitlements [list]
caddy rate-limit top [-n 20]
caddy rate-limit ui [--listen 127.0.0.1:2020]
caddy rate-limit simulate --config <file> --log <file>... [--format caddy|combined|jsonl] [--against <file>] [--from <time>] [--to <time>]`

// synopsisFlags says what every command of synopsis takes.
const synopsisFlags = `Every command takes --address <admin address> (else the admin address of
--config <file> [--adapter <name>], else localhost:2019) and --json (print
the API's JSON instead of a table).`

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "trees|inspect|reset|override|mode|entitlements|top|ui|simulate [args]",
		Short: "Inspects and steers Cascade's rate limits through the admin API",
		Long: `
Inspects and steers the rate limits of a running Caddy through its admin
endpoint (the admin.api.rate_limit module of Cascade):

` + indentText(synopsis, "  ") + `

` + synopsisFlags + `

A limit is written as in the Caddyfile: "<count>/<per>" or
"<count> <dimension>/<per>", then optionally "burst <n>", an algorithm
(gcra, sliding, sliding approx, calendar, fixed) and "tz <zone>"; e.g. "50000/h",
"5000000 tokens/h burst 100000", "1000000 tokens/month tz Europe/Paris".
A value is given as clients send it: ':', '/', spaces and unicode need no
escaping (quote them for the shell).`,
		CobraFunc: addCommands,
	})
}

// NewCommand returns the rate-limit command as `caddy rate-limit` runs it,
// standing alone (for tests and other front ends).
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "rate-limit", Short: "Inspects and steers Cascade's rate limits through the admin API"}
	addCommands(cmd)
	return cmd
}

func addCommands(cmd *cobra.Command) {
	pf := cmd.PersistentFlags()
	pf.String("address", "", "The address of Caddy's admin endpoint (default: the one of --config, else localhost:2019)")
	pf.StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	pf.StringP("adapter", "a", "", "Name of the config adapter of --config")
	pf.Bool("json", false, "Print the API's JSON instead of a table")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q: use trees, inspect, reset, override, mode, entitlements, top, ui or simulate", args[0])
		}
		return cmd.Help()
	}
	cmd.AddCommand(treesCommand(), inspectCommand(), resetCommand(), overrideCommand(), modeCommand(), entitlementsCommand(), topCommand(), uiCommand())
	for _, sub := range subcommands {
		cmd.AddCommand(sub())
	}
}

// subcommands are the commands of `caddy rate-limit` that other packages
// add (the root's simulate, which this package cannot import).
var subcommands []func() *cobra.Command

// AddSubcommand adds a command to `caddy rate-limit`. Call it from an init
// function, as modules are registered.
func AddSubcommand(cmd func() *cobra.Command) { subcommands = append(subcommands, cmd) }

// now is the clock of the relative times printed ("in 2 h").
var now = time.Now

// client talks to the admin API for one command.
type client struct {
	address string
	json    bool
	out     io.Writer
}

// clientOf returns the client of a command. It is called once the
// arguments are known to be good: from then on an error is the server's
// or the network's, and the usage is not printed with it.
func clientOf(cmd *cobra.Command) (*client, error) {
	fl := cmd.Flags()
	address, _ := fl.GetString("address")
	config, _ := fl.GetString("config")
	adapter, _ := fl.GetString("adapter")
	asJSON, _ := fl.GetBool("json")
	if adapter != "" && config == "" {
		return nil, errors.New("--adapter applies to --config: give the configuration file too")
	}
	cmd.SilenceUsage = true
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return nil, fmt.Errorf("finding the admin address: %v", err)
	}
	return &client{address: addr, json: asJSON, out: cmd.OutOrStdout()}, nil
}

// do sends one request (body, if not nil, as JSON) and decodes the answer
// into out; with --json it prints the answer instead. It reports whether
// the answer was printed (then the caller prints nothing more). A body of
// url.Values is sent as a form: the tiers' values, kept out of the URI
// that Caddy's admin endpoint logs.
func (c *client) do(method, uri string, body, out any) (printed bool, err error) {
	var rd io.Reader
	var hdr http.Header
	if form, ok := body.(url.Values); ok {
		rd = strings.NewReader(form.Encode())
		hdr = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return false, err
		}
		rd = bytes.NewReader(b)
	}
	res, err := caddycmd.AdminAPIRequest(c.address, method, uri, hdr, rd)
	if err != nil {
		return false, apiMessage(c.address, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return false, fmt.Errorf("reading the answer of %s: %v", c.address, err)
	}
	if c.json {
		var buf bytes.Buffer
		if json.Indent(&buf, raw, "", "  ") == nil {
			raw = buf.Bytes()
		}
		_, err = fmt.Fprintln(c.out, strings.TrimSpace(string(raw)))
		return true, err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return false, fmt.Errorf("the answer of %s %s is not the JSON expected (%v): %.200s", method, uri, err, raw)
	}
	return false, nil
}

// apiMessage turns an error of caddycmd.AdminAPIRequest into the server's
// own message, or says what is likely wrong.
func apiMessage(addr string, err error) error {
	s := err.Error()
	if _, rest, ok := strings.Cut(s, "caddy responded with error: HTTP "); ok {
		status, body, _ := strings.Cut(rest, ": ")
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(body), &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		if status == "404" {
			return fmt.Errorf("the admin endpoint at %s has no rate-limit API (HTTP 404): is this Caddy built with Cascade?", addr)
		}
		return fmt.Errorf("HTTP %s: %s", status, strings.TrimSpace(body))
	}
	if strings.HasPrefix(s, "performing request") {
		return fmt.Errorf("%v: is Caddy running, with its admin endpoint at %s? (give it with --address, or --config)", err, addr)
	}
	return err
}

// pathQuery turns <tier>=<value> arguments into the query of a path of
// tree. Tiers are sent as tier.<name>, which no query parameter of the API
// clashes with.
func pathQuery(tree string, args []string) (url.Values, error) {
	q := url.Values{"tree": {tree}}
	for _, a := range args {
		tier, value, ok := strings.Cut(a, "=")
		if !ok || tier == "" {
			return nil, fmt.Errorf("%q: write <tier>=<value>, e.g. user=alice", a)
		}
		if q.Has("tier." + tier) {
			return nil, fmt.Errorf("tier %s is given twice: give each tier one value", tier)
		}
		q.Set("tier."+tier, value)
	}
	return q, nil
}

func pathText(tree string, path []PathValue) string {
	if len(path) == 0 {
		return tree
	}
	parts := []string{tree + ":"}
	for _, p := range path {
		parts = append(parts, p.Tier+"="+show(p.Value))
	}
	return strings.Join(parts, " ")
}

// --- trees

func treesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "trees",
		Short: "Lists the running trees: their mode, tiers, limits and the per-value limits in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var trees []Tree
			if printed, err := c.do("GET", "/rate_limit/trees", nil, &trees); err != nil || printed {
				return err
			}
			renderTrees(c.out, trees)
			return nil
		},
	}
}

func renderTrees(w io.Writer, trees []Tree) {
	if len(trees) == 0 {
		fmt.Fprintln(w, "no trees: the running configuration has no rate_limit handler")
		return
	}
	for i, t := range trees {
		if i > 0 {
			fmt.Fprintln(w)
		}
		mode := "mode " + t.Mode
		if m := t.ModeOverride; m != nil {
			mode += " (set at runtime" + timeText(" ", m.Updated) + noteText(": ", m.Note) + "; configured " + t.ConfiguredMode + ")"
		} else if t.ConfiguredMode != "" && t.ConfiguredMode != t.Mode {
			mode += " (configured " + t.ConfiguredMode + ")"
		}
		fmt.Fprintf(w, "tree %s: %s, store %s\n", t.Name, mode, t.Store)
		var rows [][]string
		for _, tier := range t.Tiers {
			limits, source := "-", "tier"
			if len(tier.Limits) > 0 {
				limits = limitsText(tier.Limits, false)
			}
			if tier.Adaptive {
				source += ", adaptive"
			}
			rows = append(rows, []string{"  " + tier.Name, tier.Key, tier.Missing, "*", limits, source, ""})
			for _, v := range tier.Values {
				source := v.Source
				if v.Expires != nil {
					source += " until " + v.Expires.UTC().Format(time.RFC3339)
				}
				if cv := v.Configured; cv != nil {
					source += ", replaces " + limitsText(cv.Limits, cv.Unlimited)
				}
				rows = append(rows, []string{"", "", "", show(v.Value), limitsText(v.Limits, v.Unlimited), source, note(v.Note)})
			}
		}
		table(w, []string{"  TIER", "KEY", "MISSING", "VALUE", "LIMITS", "SOURCE", "NOTE"}, rows)
	}
}

func limitsText(ls []Limit, unlimited bool) string {
	if unlimited {
		return "unlimited"
	}
	if len(ls) == 0 {
		return "-"
	}
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.Text
		if parts[i] == "" {
			parts[i] = limitText(&l.Limit)
		}
	}
	return strings.Join(parts, ", ")
}

// limitText is a limit as the Caddyfile writes it, time zone included.
func limitText(l *hierarchy.Limit) string {
	s := l.String()
	if l.Timezone != "" {
		s += " tz " + l.Timezone
	}
	return s
}

// --- inspect

func inspectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect <tree> <tier>=<value>...",
		Short: "Shows the buckets of one path and whether a request would be admitted, charging nothing",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := pathQuery(args[0], args[1:])
			if err != nil {
				return err
			}
			fl := cmd.Flags()
			if fl.Changed("cost") {
				cost, _ := fl.GetInt64("cost")
				if cost < 0 {
					return fmt.Errorf("--cost %d: give a whole number, 0 or more", cost)
				}
				q.Set("cost", strconv.FormatInt(cost, 10))
			}
			costIn, _ := fl.GetStringArray("cost-in")
			for _, ci := range costIn {
				for _, one := range strings.Split(ci, ",") {
					dim, n, ok := strings.Cut(strings.TrimSpace(one), "=")
					v, err := strconv.ParseInt(n, 10, 64)
					if !ok || dim == "" || err != nil || v < 0 {
						return fmt.Errorf("--cost-in %q: write <dimension>=<n>, n a whole number 0 or more, e.g. tokens=500", one)
					}
					if q.Has("cost." + dim) {
						return fmt.Errorf("--cost-in: the cost in %s is given twice", dim)
					}
					q.Set("cost."+dim, strconv.FormatInt(v, 10))
				}
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var b Buckets
			if printed, err := c.do("POST", "/rate_limit/buckets", q, &b); err != nil || printed {
				return err
			}
			renderBuckets(c.out, &b)
			return nil
		},
	}
	cmd.Flags().Int64("cost", 1, "The cost of the request asked about, in every dimension but requests (in requests when the tree counts nothing else)")
	cmd.Flags().StringArray("cost-in", nil, "The cost in one dimension, <dimension>=<n>, e.g. tokens=500 (repeatable)")
	return cmd
}

func renderBuckets(w io.Writer, b *Buckets) {
	fmt.Fprintf(w, "tree %s\n", pathText(b.Tree, b.Path))
	rows := make([][]string, 0, len(b.Buckets))
	for _, bk := range b.Buckets {
		capacity := fmt.Sprintf("%d/%d", bk.Remaining, bk.Capacity)
		if bk.Scaled {
			capacity += " (scaled)"
		}
		fullIn := "full"
		if bk.FullIn > 0 {
			fullIn = seconds(bk.FullIn)
		}
		retry := "now"
		switch {
		case bk.Impossible:
			retry = "never"
		case bk.RetryAfter > 0:
			retry = seconds(bk.RetryAfter)
		}
		rows = append(rows, []string{bk.Tier, show(bk.Value), bk.Limit, bk.Source, capacity, fullIn, retry})
	}
	table(w, []string{"TIER", "VALUE", "LIMIT", "SOURCE", "REMAINING/CAPACITY", "FULL IN", "RETRY AFTER"}, rows)
	req := "a request costing " + costText(b.Cost)
	switch {
	case b.Impossible:
		fmt.Fprintf(w, "%s can never be admitted: it is over a bucket's capacity\n", req)
	case b.Allowed:
		fmt.Fprintf(w, "%s would be admitted now\n", req)
	default:
		fmt.Fprintf(w, "%s would be refused now (Retry-After %s; with max_wait that long, it would wait instead)\n", req, seconds(b.RetryAfter))
	}
}

// costText is a cost per dimension, requests first: "1 request, 500 tokens".
func costText(cost map[string]int64) string {
	dims := make([]string, 0, len(cost))
	for d := range cost {
		dims = append(dims, d)
	}
	slices.SortFunc(dims, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == hierarchy.Requests:
			return -1
		case b == hierarchy.Requests:
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(dims))
	for i, d := range dims {
		n := cost[d]
		if n == 1 && len(d) > 1 {
			d = strings.TrimSuffix(d, "s") // 1 request, 1 token
		}
		parts[i] = fmt.Sprintf("%d %s", n, d)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// --- reset

func resetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reset <tree> <tier>=<value>...",
		Short: "Makes the buckets of the last value given full again (--below: its whole subtree)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := pathQuery(args[0], args[1:])
			if err != nil {
				return err
			}
			if below, _ := cmd.Flags().GetBool("below"); below {
				q.Set("below", "1")
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var r Reset
			if printed, err := c.do("POST", "/rate_limit/reset", q, &r); err != nil || printed {
				return err
			}
			renderReset(c.out, &r)
			return nil
		},
	}
	cmd.Flags().Bool("below", false, "Reset every bucket of the subtree of the last value given")
	return cmd
}

func renderReset(w io.Writer, r *Reset) {
	below := ""
	if r.Below {
		below = " and below"
	}
	fmt.Fprintf(w, "reset %d bucket(s) of %s%s\n", r.Buckets, pathText(r.Tree, r.Path), below)
}

// --- override

// overridePath is the path of a tier's overrides; the value goes in the
// body, not the path, which Caddy's admin log records.
func overridePath(tree, tier string) string {
	return "/rate_limit/overrides/" + url.PathEscape(tree) + "/" + url.PathEscape(tier)
}

func overrideCommand() *cobra.Command {
	set := &cobra.Command{
		Use:   "set <tree> <tier> <value>",
		Short: "Sets the limits of one value of a tier, on every instance sharing the store",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := overrideRequest(cmd)
			if err != nil {
				return err
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			req.Value = &args[2]
			var ch Change[control.Override]
			if printed, err := c.do("PUT", overridePath(args[0], args[1]), req, &ch); err != nil || printed {
				return err
			}
			fmt.Fprintf(c.out, "%s/%s/%s: %s → %s\n", args[0], args[1], show(answeredValue(ch, overrideValue)), overrideText(ch.Old), overrideText(ch.New)+expiresText(ch.New))
			return nil
		},
	}
	sf := set.Flags()
	sf.StringArray("limit", nil, `A limit, as in the Caddyfile: "50000/h", "5000000 tokens/h burst 100000" (repeatable)`)
	sf.Bool("unlimited", false, "Exempt the value from the tier instead")
	sf.String("expires", "", "When the override ends by itself: an RFC 3339 time such as 2026-12-01T16:00:00Z, or a duration such as 24h")
	sf.String("for", "", "How long the override lasts, such as 2h or 30d (instead of --expires)")
	sf.String("note", "", "Who set it and why")

	del := &cobra.Command{
		Use:   "delete <tree> <tier> <value>",
		Short: "Deletes the override of one value: its limits are the configuration's again",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var ch Change[control.Override]
			if printed, err := c.do("DELETE", overridePath(args[0], args[1]), map[string]string{"value": args[2]}, &ch); err != nil || printed {
				return err
			}
			if ch.Old == nil {
				fmt.Fprintf(c.out, "%s/%s: the value given had no override: nothing changed\n", args[0], args[1])
			} else {
				fmt.Fprintf(c.out, "%s/%s/%s: %s → the configuration's\n", args[0], args[1], show(answeredValue(ch, overrideValue)), overrideText(ch.Old))
			}
			return nil
		},
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "Lists the runtime overrides and modes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var o Overrides
			if printed, err := c.do("GET", "/rate_limit/overrides", nil, &o); err != nil || printed {
				return err
			}
			renderOverrides(c.out, &o)
			return nil
		},
	}

	cmd := &cobra.Command{
		Use:   "override",
		Short: "Sets, deletes and lists the runtime overrides of per-value limits",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(set, del, list)
	return cmd
}

// overrideRequest reads the flags of `override set`.
func overrideRequest(cmd *cobra.Command) (*OverrideRequest, error) {
	fl := cmd.Flags()
	specs, _ := fl.GetStringArray("limit")
	req := &OverrideRequest{}
	req.Unlimited, _ = fl.GetBool("unlimited")
	req.Note, _ = fl.GetString("note")
	switch {
	case req.Unlimited && len(specs) > 0:
		return nil, errors.New("--unlimited and --limit exclude each other: an override has limits or none")
	case !req.Unlimited && len(specs) == 0:
		return nil, errors.New(`give the value's limits, --limit "50000/h" (repeatable), or --unlimited`)
	}
	var err error
	if req.Limits, err = parseLimits(specs); err != nil {
		return nil, err
	}
	if req.Expires, err = expiresFlag(cmd); err != nil {
		return nil, err
	}
	return req, nil
}

// expiresFlag reads --expires (an RFC 3339 time, or a duration from now)
// and --for (a duration from now): the expiry to send, "" for none.
func expiresFlag(cmd *cobra.Command) (string, error) {
	fl := cmd.Flags()
	expires, _ := fl.GetString("expires")
	lasts, _ := fl.GetString("for")
	switch {
	case expires != "" && lasts != "":
		return "", errors.New("--expires and --for exclude each other: give one")
	case expires != "":
		t, err := time.Parse(time.RFC3339, expires)
		if err != nil {
			d, derr := caddy.ParseDuration(expires)
			if derr != nil || d <= 0 {
				return "", fmt.Errorf("--expires %q: write an RFC 3339 time such as %s, or a duration such as 24h", expires, now().Add(24*time.Hour).UTC().Format(time.RFC3339))
			}
			return now().Add(d).UTC().Format(time.RFC3339), nil
		}
		if !t.After(now()) {
			return "", fmt.Errorf("--expires %s is in the past", expires)
		}
		return expires, nil
	case lasts != "":
		d, err := caddy.ParseDuration(lasts)
		if err != nil || d <= 0 {
			return "", fmt.Errorf("--for %q: give a duration such as 90m, 2h or 30d", lasts)
		}
		return now().Add(d).UTC().Format(time.RFC3339), nil
	}
	return "", nil
}

func overrideText(o *control.Override) string {
	switch {
	case o == nil:
		return "none"
	case o.Unlimited:
		return "unlimited"
	case len(o.Limits) == 0:
		return "-"
	}
	parts := make([]string, len(o.Limits))
	for i, l := range o.Limits {
		parts[i] = limitText(l)
	}
	return strings.Join(parts, ", ")
}

func expiresText(o *control.Override) string {
	if o == nil {
		return ""
	}
	return untilText(o.Expires)
}

// untilText is " until <when>" for an expiry, "" for none.
func untilText(expires time.Time) string {
	if expires.IsZero() {
		return ""
	}
	return " until " + whenText(expires)
}

func renderOverrides(w io.Writer, o *Overrides) {
	if len(o.Overrides) == 0 {
		fmt.Fprintln(w, "no runtime overrides")
	} else {
		rows := make([][]string, 0, len(o.Overrides))
		for _, ov := range o.Overrides {
			exp := "never"
			if !ov.Expires.IsZero() {
				exp = whenText(ov.Expires)
			}
			rows = append(rows, []string{ov.Tree, ov.Tier, show(ov.Value), overrideText(ov), exp, note(ov.Note)})
		}
		table(w, []string{"TREE", "TIER", "VALUE", "LIMITS", "EXPIRES", "NOTE"}, rows)
	}
	fmt.Fprintln(w)
	if len(o.Modes) == 0 {
		fmt.Fprintln(w, "no runtime modes")
		return
	}
	rows := make([][]string, 0, len(o.Modes))
	for _, m := range o.Modes {
		rows = append(rows, []string{m.Tree, m.Mode, timeText("", m.Updated), note(m.Note)})
	}
	table(w, []string{"TREE", "MODE", "SET", "NOTE"}, rows)
}

// --- mode

func modeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mode <tree> enforce|warn|shadow | mode <tree> --reset",
		Short: "Sets a tree's mode on every instance sharing the store (--reset: back to the configured one)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			reset, _ := fl.GetBool("reset")
			note, _ := fl.GetString("note")
			tree := args[0]
			var body any
			method := "PUT"
			switch {
			case reset && len(args) == 2:
				return fmt.Errorf("--reset returns %s to its configured mode: give no mode with it", tree)
			case reset && note != "":
				return errors.New("--note goes with a mode set, not with --reset")
			case reset:
				method = "DELETE"
			case len(args) == 1:
				return errors.New("give a mode: enforce, warn or shadow (or --reset for the configured one)")
			default:
				switch args[1] {
				case control.ModeEnforce, control.ModeWarn, control.ModeShadow:
				default:
					return fmt.Errorf("mode %q: use enforce, warn or shadow", args[1])
				}
				body = ModeRequest{Mode: args[1], Note: note}
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var ch Change[control.Mode]
			if printed, err := c.do(method, "/rate_limit/mode/"+url.PathEscape(tree), body, &ch); err != nil || printed {
				return err
			}
			if reset && ch.Old == nil {
				fmt.Fprintf(c.out, "mode of %s: already the configured one, nothing changed\n", tree)
				return nil
			}
			fmt.Fprintf(c.out, "mode of %s: %s → %s\n", tree, modeText(ch.Old), modeText(ch.New))
			return nil
		},
	}
	cmd.Flags().Bool("reset", false, "Return the tree to its configured mode")
	cmd.Flags().String("note", "", "Who set the mode and why")
	return cmd
}

func modeText(m *control.Mode) string {
	if m == nil {
		return "configured"
	}
	return m.Mode
}

// --- entitlements

// entitlementPath is the path of an entitlements block's runtime
// entitlements; the value goes in the body, not the path, which Caddy's
// admin log records.
func entitlementPath(name string) string {
	return "/rate_limit/entitlements/" + url.PathEscape(name)
}

func entitlementsCommand() *cobra.Command {
	set := &cobra.Command{
		Use:   "set <name> <value>",
		Short: "Sets one value's plan (and limits of its own) in an entitlements block, on every instance sharing the store",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := entitlementRequest(cmd)
			if err != nil {
				return err
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			req.Value = &args[1]
			var ch Change[control.Entitlement]
			if printed, err := c.do("PUT", entitlementPath(args[0]), req, &ch); err != nil || printed {
				return err
			}
			until := ""
			if ch.New != nil {
				until = untilText(ch.New.Expires)
			}
			fmt.Fprintf(c.out, "%s/%s: %s → %s\n", args[0], show(answeredValue(ch, entitlementValue)), entitlementText(ch.Old), entitlementText(ch.New)+until)
			return nil
		},
	}
	sf := set.Flags()
	sf.String("plan", "", "The plan the value is on, such as pro")
	sf.StringArray("limit", nil, `A limit of the value's own, as in the Caddyfile: "50000/h", "5000000 tokens/h burst 100000" (repeatable)`)
	sf.String("expires", "", "When the entitlement ends by itself: an RFC 3339 time such as 2026-12-01T16:00:00Z, or a duration such as 24h")
	sf.String("for", "", "How long the entitlement lasts, such as 2h or 30d (instead of --expires)")
	sf.String("note", "", "Who set it and why")

	del := &cobra.Command{
		Use:   "delete <name> <value>",
		Short: "Deletes the runtime entitlement of one value: the entitlements source answers for it again",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var ch Change[control.Entitlement]
			if printed, err := c.do("DELETE", entitlementPath(args[0]), map[string]string{"value": args[1]}, &ch); err != nil || printed {
				return err
			}
			if ch.Old == nil {
				fmt.Fprintf(c.out, "%s: the value given had no runtime entitlement: nothing changed\n", args[0])
			} else {
				fmt.Fprintf(c.out, "%s/%s: %s → the source's\n", args[0], show(answeredValue(ch, entitlementValue)), entitlementText(ch.Old))
			}
			return nil
		},
	}

	listRun := func(cmd *cobra.Command, _ []string) error {
		c, err := clientOf(cmd)
		if err != nil {
			return err
		}
		var es []*control.Entitlement
		if printed, err := c.do("GET", "/rate_limit/entitlements", nil, &es); err != nil || printed {
			return err
		}
		renderEntitlements(c.out, es)
		return nil
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "Lists the runtime entitlements",
		Args:  cobra.NoArgs,
		RunE:  listRun,
	}

	cmd := &cobra.Command{
		Use:   "entitlements",
		Short: "Sets, deletes and lists runtime entitlements: a value's plan, over what its entitlements source says (alone: list)",
		Args:  cobra.NoArgs,
		RunE:  listRun,
	}
	cmd.AddCommand(set, del, list)
	return cmd
}

// entitlementRequest reads the flags of `entitlements set`.
func entitlementRequest(cmd *cobra.Command) (*EntitlementRequest, error) {
	fl := cmd.Flags()
	specs, _ := fl.GetStringArray("limit")
	req := &EntitlementRequest{}
	req.Plan, _ = fl.GetString("plan")
	req.Note, _ = fl.GetString("note")
	if req.Plan == "" && len(specs) == 0 {
		return nil, errors.New(`give the value's plan, --plan pro, its own limits, --limit "50000/h" (repeatable), or both`)
	}
	var err error
	if req.Limits, err = parseLimits(specs); err != nil {
		return nil, err
	}
	if req.Expires, err = expiresFlag(cmd); err != nil {
		return nil, err
	}
	return req, nil
}

// entitlementText is an entitlement in a line: "plan pro, 100/h"; nil is
// the source's answer.
func entitlementText(e *control.Entitlement) string {
	if e == nil {
		return "the source's"
	}
	var parts []string
	if e.Plan != "" {
		parts = append(parts, "plan "+e.Plan)
	}
	for _, l := range e.Limits {
		parts = append(parts, limitText(l))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func renderEntitlements(w io.Writer, es []*control.Entitlement) {
	if len(es) == 0 {
		fmt.Fprintln(w, "no runtime entitlements")
		return
	}
	rows := make([][]string, 0, len(es))
	for _, e := range es {
		plan, limits, exp := "-", "-", "never"
		if e.Plan != "" {
			plan = e.Plan
		}
		if len(e.Limits) > 0 {
			parts := make([]string, len(e.Limits))
			for i, l := range e.Limits {
				parts[i] = limitText(l)
			}
			limits = strings.Join(parts, ", ")
		}
		if !e.Expires.IsZero() {
			exp = whenText(e.Expires)
		}
		rows = append(rows, []string{e.Name, show(e.Value), plan, limits, exp, note(e.Note)})
	}
	table(w, []string{"NAME", "VALUE", "PLAN", "LIMITS", "EXPIRES", "NOTE"}, rows)
}

// --- top

func topCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top [-n 20]",
		Short: "Lists the most-denied keys since the process started",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, _ := cmd.Flags().GetInt("n")
			if n < 1 {
				return fmt.Errorf("-n %d: give a number of keys, 1 or more", n)
			}
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var t Top
			if printed, err := c.do("GET", "/rate_limit/top?n="+strconv.Itoa(n), nil, &t); err != nil || printed {
				return err
			}
			renderTop(c.out, &t)
			return nil
		},
	}
	cmd.Flags().IntP("n", "n", 20, "How many keys")
	return cmd
}

func renderTop(w io.Writer, t *Top) {
	rows := make([][]string, 0, len(t.Keys))
	for _, e := range t.Keys {
		path := make([]string, len(e.Path))
		for i, p := range e.Path {
			path[i] = p.Tier + "=" + show(p.Value)
		}
		errText := "exact"
		if e.Error > 0 {
			errText = "±" + strconv.FormatUint(e.Error, 10)
		}
		rows = append(rows, []string{strconv.FormatUint(e.Count, 10), errText, e.Tree, e.Tier, strings.Join(path, " ")})
	}
	table(w, []string{"DENIALS", "ERROR", "TREE", "TIER", "PATH"}, rows)
	fmt.Fprintf(w, "%d denials counted\n", t.Total)
}

// --- the limit syntax

// parseLimits parses the limits of repeated --limit flags.
func parseLimits(specs []string) ([]*hierarchy.Limit, error) {
	var out []*hierarchy.Limit
	for _, s := range specs {
		l, err := ParseLimit(s)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// ParseLimit parses a limit as the Caddyfile writes it: "<count>/<per>" or
// "<count> <dimension>/<per>", then optionally "burst <n>", an algorithm
// (gcra, sliding, sliding approx, calendar, fixed) and "tz <zone>", in any order;
// or "<count> concurrent". The limit is validated as a configuration's is.
func ParseLimit(s string) (*hierarchy.Limit, error) {
	const usage = `write e.g. "1000/h", "100000 tokens/h burst 5000", "1000000 tokens/month tz Europe/Paris" or "10 concurrent"`
	f := strings.Fields(s)
	if len(f) == 0 {
		return nil, fmt.Errorf("limit %q: empty; %s", s, usage)
	}
	l := &hierarchy.Limit{}
	if len(f) == 2 && f[1] == "concurrent" { // "<count> concurrent": requests in flight
		n, err := strconv.ParseInt(strings.ReplaceAll(f[0], "_", ""), 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("limit %q: count %q must be a positive whole number", s, f[0])
		}
		l.Count, l.Algorithm = n, "concurrent"
		return l, l.Validate()
	}
	count, per, ok := strings.Cut(f[0], "/")
	rest := f[1:]
	if !ok {
		// "<count> <dimension>/<per>"
		if len(rest) == 0 {
			return nil, fmt.Errorf("limit %q: no period; %s", s, usage)
		}
		if l.Dimension, per, ok = strings.Cut(rest[0], "/"); !ok {
			return nil, fmt.Errorf("limit %q: no period; %s", s, usage)
		}
		if l.Dimension == "" {
			return nil, fmt.Errorf("limit %q: no dimension before the /; %s", s, usage)
		}
		rest = rest[1:]
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(count, "_", ""), 10, 64)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("limit %q: count %q must be a positive whole number", s, count)
	}
	if per == "" {
		return nil, fmt.Errorf("limit %q: no period after the /; %s", s, usage)
	}
	l.Count, l.Per = n, per
	seen := map[string]bool{}
	once := func(what string) error {
		if seen[what] {
			return fmt.Errorf("limit %q: %s is given twice", s, what)
		}
		seen[what] = true
		return nil
	}
	for len(rest) > 0 {
		switch w := rest[0]; w {
		case "burst":
			if err := once("burst"); err != nil {
				return nil, err
			}
			if len(rest) < 2 {
				return nil, fmt.Errorf("limit %q: burst needs a number", s)
			}
			b, err := strconv.ParseInt(strings.ReplaceAll(rest[1], "_", ""), 10, 64)
			if err != nil || b <= 0 {
				return nil, fmt.Errorf("limit %q: burst %q must be a positive whole number", s, rest[1])
			}
			l.Burst, rest = b, rest[2:]
		case "tz":
			if err := once("tz"); err != nil {
				return nil, err
			}
			if len(rest) < 2 {
				return nil, fmt.Errorf("limit %q: tz needs a time zone name such as Europe/Paris", s)
			}
			l.Timezone, rest = rest[1], rest[2:]
		case "gcra", "sliding", "calendar", "sliding_approx", hierarchy.Fixed:
			if err := once("the algorithm"); err != nil {
				return nil, err
			}
			l.Algorithm, rest = w, rest[1:]
			if w == "sliding" && len(rest) > 0 && rest[0] == "approx" {
				l.Algorithm, rest = "sliding_approx", rest[1:]
			}
		default:
			return nil, fmt.Errorf("limit %q: unexpected %q; %s", s, w, usage)
		}
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("limit %q: %v", s, err)
	}
	return l, nil
}

// --- text helpers

// table writes an aligned table: a header and its rows.
func table(w io.Writer, header []string, rows [][]string) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
	// No trailing blanks where the last cells are empty.
	for line := range strings.Lines(buf.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

// maxShown is how many characters of a value a table shows.
const maxShown = 48

// show is a value as a table shows it: as it is when it is printable
// without spaces, else quoted in Go's syntax; a long value is cut, with
// its length in bytes.
func show(v string) string {
	long := utf8.RuneCountInString(v) > maxShown
	s := v
	if long {
		i, n := 0, 0
		for n < maxShown-8 {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			n++
		}
		s = s[:i]
	}
	if v == "" || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) || r == '"' }) {
		s = strconv.Quote(s)
	}
	if long {
		s += fmt.Sprintf("…(%d bytes)", len(v))
	}
	return s
}

// note is a note on one line: quoted if it holds a line break, a tab or
// anything unprintable.
func note(s string) string {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

func noteText(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + note(s)
}

func timeText(prefix string, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return prefix + t.UTC().Format(time.RFC3339)
}

// whenText is a time to come, with how far it is: "2026-12-01T16:00:00Z
// (in 2 h 5 min)".
func whenText(t time.Time) string {
	s := t.UTC().Format(time.RFC3339)
	if d := t.Sub(now()); d > 0 {
		s += " (in " + seconds(d.Seconds()) + ")"
	}
	return s
}

// seconds is a number of seconds for people, to the millisecond below a
// second and more roughly above: "0.25 s", "1.5 s", "12 s", "2 min 30 s",
// "3 h 20 min", "2 d 4 h".
func seconds(s float64) string {
	switch {
	case s < 1:
		return strconv.FormatFloat(math.Round(s*1000)/1000, 'f', -1, 64) + " s"
	case s < 10:
		return strconv.FormatFloat(math.Round(s*10)/10, 'f', -1, 64) + " s"
	case s < 59.5:
		return strconv.FormatFloat(math.Round(s), 'f', -1, 64) + " s"
	}
	total := int64(math.Round(s))
	units := []struct {
		name string
		size int64
	}{{"d", 86400}, {"h", 3600}, {"min", 60}, {"s", 1}}
	for i, u := range units {
		if total < u.size {
			continue
		}
		out := strconv.FormatInt(total/u.size, 10) + " " + u.name
		if next := units[min(i+1, len(units)-1)]; next != u {
			if n := total % u.size / next.size; n > 0 {
				out += " " + strconv.FormatInt(n, 10) + " " + next.name
			}
		}
		return out
	}
	return "0 s"
}

func indentText(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n")
}

// answeredValue is the value of an override or entitlement as the API
// answered it (valueOf reads it): the value given, or its fingerprint when
// it is sensitive. The CLI prints that rather than its argument, so that
// a secret is never echoed.
func answeredValue[T any](ch Change[T], valueOf func(*T) string) string {
	switch {
	case ch.New != nil:
		return valueOf(ch.New)
	case ch.Old != nil:
		return valueOf(ch.Old)
	}
	return "(the value given)"
}

func overrideValue(o *control.Override) string       { return o.Value }
func entitlementValue(e *control.Entitlement) string { return e.Value }
