package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "trees|inspect|reset|override|mode|top …",
		Short: "Inspects and steers Cascade's rate limits through the admin API",
		Long: `
Inspects and steers the rate limits of a running Caddy through its admin
endpoint (the admin.api.rate_limit module):

  caddy rate-limit trees
  caddy rate-limit inspect <tree> <tier>=<value>... [--cost N] [--cost-in dim=N]
  caddy rate-limit reset <tree> <tier>=<value>... [--below]
  caddy rate-limit override set <tree> <tier> <value> --limit "50000/h" [--limit "5000000 tokens/h"] [--unlimited] [--expires RFC3339 | --for 2h] [--note "..."]
  caddy rate-limit override delete <tree> <tier> <value>
  caddy rate-limit override list
  caddy rate-limit mode <tree> enforce|warn|shadow [--note "..."]
  caddy rate-limit mode <tree> --reset
  caddy rate-limit top [-n 20]

The admin address is --address, else the one of --config (and --adapter),
else localhost:2019. --json prints the API's JSON.`,
		CobraFunc: addCommands,
	})
}

// NewCommand returns the rate-limit command as `caddy rate-limit` runs it.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "rate-limit"}
	addCommands(cmd)
	return cmd
}

func addCommands(cmd *cobra.Command) {
	cmd.PersistentFlags().String("address", "", "The address of the admin API")
	cmd.PersistentFlags().StringP("config", "c", "", "Configuration file to find the admin address in")
	cmd.PersistentFlags().StringP("adapter", "a", "", "Name of config adapter")
	cmd.PersistentFlags().Bool("json", false, "Print the API's JSON")
	cmd.AddCommand(
		&cobra.Command{Use: "trees", Short: "Lists the running trees", Args: cobra.NoArgs, RunE: runTrees},
		inspectCommand(), resetCommand(), overrideCommand(), modeCommand(), topCommand(),
	)
}

// client talks to the admin API for one command.
type client struct {
	address string
	json    bool
	out     io.Writer
}

func clientOf(cmd *cobra.Command) (*client, error) {
	fl := cmd.Flags()
	address, _ := fl.GetString("address")
	config, _ := fl.GetString("config")
	adapter, _ := fl.GetString("adapter")
	asJSON, _ := fl.GetBool("json")
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return nil, err
	}
	return &client{address: addr, json: asJSON, out: cmd.OutOrStdout()}, nil
}

// do sends one request and decodes the answer into out; with --json it
// prints the answer as it is.
func (c *client) do(method, uri string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	res, err := caddycmd.AdminAPIRequest(c.address, method, uri, http.Header{"Content-Type": {"application/json"}}, rd)
	if err != nil {
		return apiMessage(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if c.json {
		var buf bytes.Buffer
		if json.Indent(&buf, raw, "", "  ") == nil {
			raw = buf.Bytes()
		}
		_, err = fmt.Fprintln(c.out, strings.TrimSpace(string(raw)))
		return err
	}
	return json.Unmarshal(raw, out)
}

// apiMessage turns AdminAPIRequest's error into the API's own message.
func apiMessage(err error) error {
	s := err.Error()
	if i := strings.Index(s, "{"); i >= 0 {
		var e struct{ Error string }
		if json.Unmarshal([]byte(s[i:]), &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
	}
	return err
}

// pathQuery turns <tier>=<value> arguments into a query.
func pathQuery(tree string, args []string) (url.Values, error) {
	q := url.Values{"tree": {tree}}
	for _, a := range args {
		tier, value, ok := strings.Cut(a, "=")
		if !ok || tier == "" {
			return nil, fmt.Errorf("%q: write <tier>=<value>, e.g. user=alice", a)
		}
		q.Set("tier."+tier, value)
	}
	return q, nil
}

func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

func secs(s float64) string {
	if s == 0 {
		return "0"
	}
	return strconv.FormatFloat(s, 'f', -1, 64) + " s"
}

func runTrees(cmd *cobra.Command, _ []string) error {
	c, err := clientOf(cmd)
	if err != nil {
		return err
	}
	var trees []Tree
	if err := c.do("GET", "/rate_limit/trees", nil, &trees); err != nil || c.json {
		return err
	}
	for _, t := range trees {
		fmt.Fprintf(c.out, "tree %s (%s, mode %s, configured %s)\n", t.Name, t.Store, t.Mode, t.ConfiguredMode)
		var rows [][]string
		for _, tier := range t.Tiers {
			rows = append(rows, []string{tier.Name, tier.Key, "*", limitsText(tier.Limits, false), "tier"})
			for _, v := range tier.Values {
				rows = append(rows, []string{"", "", v.Value, limitsText(v.Limits, v.Unlimited), v.Source + expiresText(v.Expires)})
			}
		}
		table(c.out, "  TIER\tKEY\tVALUE\tLIMITS\tSOURCE", indent(rows))
	}
	return nil
}

func indent(rows [][]string) [][]string {
	for i := range rows {
		rows[i][0] = "  " + rows[i][0]
	}
	return rows
}

func limitsText(ls []Limit, unlimited bool) string {
	if unlimited {
		return "unlimited"
	}
	var parts []string
	for _, l := range ls {
		parts = append(parts, l.Text)
	}
	return strings.Join(parts, ", ")
}

func expiresText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return " until " + t.Format(time.RFC3339)
}

func inspectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect <tree> <tier>=<value>...",
		Short: "Shows the buckets of one path, charging nothing",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			q, err := pathQuery(args[0], args[1:])
			if err != nil {
				return err
			}
			cost, _ := cmd.Flags().GetInt64("cost")
			q.Set("cost", strconv.FormatInt(cost, 10))
			costIn, _ := cmd.Flags().GetStringSlice("cost-in")
			for _, ci := range costIn {
				dim, n, ok := strings.Cut(ci, "=")
				if !ok {
					return fmt.Errorf("--cost-in %q: write <dimension>=<n>, e.g. tokens=500", ci)
				}
				q.Set("cost."+dim, n)
			}
			var b Buckets
			if err := c.do("GET", "/rate_limit/buckets?"+q.Encode(), nil, &b); err != nil || c.json {
				return err
			}
			var rows [][]string
			for _, bk := range b.Buckets {
				retry := secs(bk.RetryAfter)
				if bk.Impossible {
					retry = "never"
				}
				rows = append(rows, []string{bk.Tier, bk.Value, bk.Limit + " (" + bk.Source + ")",
					fmt.Sprintf("%d/%d", bk.Remaining, bk.Capacity), secs(bk.FullIn), retry})
			}
			table(c.out, "TIER\tVALUE\tLIMIT\tREMAINING\tFULL IN\tRETRY AFTER", rows)
			switch {
			case b.Impossible:
				fmt.Fprintf(c.out, "a request costing %v can never be admitted\n", b.Cost)
			case b.Allowed:
				fmt.Fprintf(c.out, "a request costing %v would be admitted now\n", b.Cost)
			default:
				fmt.Fprintf(c.out, "a request costing %v would wait %s\n", b.Cost, secs(b.RetryAfter))
			}
			return nil
		},
	}
	cmd.Flags().Int64("cost", 1, "The cost of the request asked about, in every dimension but requests")
	cmd.Flags().StringSlice("cost-in", nil, "The cost in one dimension: <dimension>=<n> (repeatable)")
	return cmd
}

func resetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reset <tree> <tier>=<value>...",
		Short: "Makes the named tier's buckets full again (--below: the whole subtree)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			q, err := pathQuery(args[0], args[1:])
			if err != nil {
				return err
			}
			if below, _ := cmd.Flags().GetBool("below"); below {
				q.Set("below", "1")
			}
			var r Reset
			if err := c.do("POST", "/rate_limit/reset?"+q.Encode(), nil, &r); err != nil || c.json {
				return err
			}
			fmt.Fprintf(c.out, "reset %d bucket(s) of %s\n", r.Buckets, r.Tree)
			return nil
		},
	}
	cmd.Flags().Bool("below", false, "Reset the whole subtree of the last value given")
	return cmd
}

func overridePath(tree, tier, value string) string {
	return "/rate_limit/overrides/" + url.PathEscape(tree) + "/" + url.PathEscape(tier) + "/" + url.PathEscape(value)
}

func overrideCommand() *cobra.Command {
	set := &cobra.Command{
		Use:   "set <tree> <tier> <value>",
		Short: "Sets the limits of one value of a tier, on every instance sharing the store",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			fl := cmd.Flags()
			specs, _ := fl.GetStringArray("limit")
			req := OverrideRequest{}
			req.Unlimited, _ = fl.GetBool("unlimited")
			req.Note, _ = fl.GetString("note")
			req.Expires, _ = fl.GetString("expires")
			if d, _ := fl.GetDuration("for"); d > 0 {
				req.Expires = time.Now().Add(d).UTC().Format(time.RFC3339)
			}
			for _, s := range specs {
				l, err := ParseLimit(s)
				if err != nil {
					return err
				}
				req.Limits = append(req.Limits, l)
			}
			var ch Change[control.Override]
			if err := c.do("PUT", overridePath(args[0], args[1], args[2]), req, &ch); err != nil || c.json {
				return err
			}
			fmt.Fprintf(c.out, "%s/%s/%s: %s → %s\n", args[0], args[1], args[2], overrideText(ch.Old), overrideText(ch.New))
			return nil
		},
	}
	set.Flags().StringArray("limit", nil, `A limit, as in the Caddyfile: "50000/h", "5000000 tokens/h burst 1000" (repeatable)`)
	set.Flags().Bool("unlimited", false, "Exempt the value from the tier")
	set.Flags().String("expires", "", "When the override goes (RFC 3339)")
	set.Flags().Duration("for", 0, "How long the override lasts (instead of --expires)")
	set.Flags().String("note", "", "Who and why")
	del := &cobra.Command{
		Use:   "delete <tree> <tier> <value>",
		Short: "Returns one value to the configuration's limits",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			var ch Change[control.Override]
			if err := c.do("DELETE", overridePath(args[0], args[1], args[2]), nil, &ch); err != nil || c.json {
				return err
			}
			fmt.Fprintf(c.out, "%s/%s/%s: %s → the configuration's\n", args[0], args[1], args[2], overrideText(ch.Old))
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
			if err := c.do("GET", "/rate_limit/overrides", nil, &o); err != nil || c.json {
				return err
			}
			var rows [][]string
			for _, ov := range o.Overrides {
				exp := "never"
				if !ov.Expires.IsZero() {
					exp = ov.Expires.Format(time.RFC3339)
				}
				rows = append(rows, []string{ov.Tree, ov.Tier, ov.Value, overrideText(ov), exp, ov.Note})
			}
			table(c.out, "TREE\tTIER\tVALUE\tLIMITS\tEXPIRES\tNOTE", rows)
			for _, m := range o.Modes {
				fmt.Fprintf(c.out, "mode of %s: %s %s\n", m.Tree, m.Mode, m.Note)
			}
			return nil
		},
	}
	cmd := &cobra.Command{Use: "override", Short: "Sets, deletes and lists runtime overrides"}
	cmd.AddCommand(set, del, list)
	return cmd
}

func overrideText(o *control.Override) string {
	switch {
	case o == nil:
		return "none"
	case o.Unlimited:
		return "unlimited"
	}
	var parts []string
	for _, l := range o.Limits {
		parts = append(parts, l.String())
	}
	return strings.Join(parts, ", ")
}

func modeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mode <tree> enforce|warn|shadow",
		Short: "Sets a tree's mode on every instance sharing the store (--reset: back to the configured one)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			path := "/rate_limit/mode/" + url.PathEscape(args[0])
			var ch Change[control.Mode]
			if reset, _ := cmd.Flags().GetBool("reset"); reset {
				if len(args) != 1 {
					return errors.New("--reset takes no mode")
				}
				err = c.do("DELETE", path, nil, &ch)
			} else {
				if len(args) != 2 {
					return errors.New("give a mode: enforce, warn or shadow (or --reset)")
				}
				note, _ := cmd.Flags().GetString("note")
				err = c.do("PUT", path, ModeRequest{Mode: args[1], Note: note}, &ch)
			}
			if err != nil || c.json {
				return err
			}
			fmt.Fprintf(c.out, "mode of %s: %s → %s\n", args[0], modeText(ch.Old), modeText(ch.New))
			return nil
		},
	}
	cmd.Flags().Bool("reset", false, "Return to the configured mode")
	cmd.Flags().String("note", "", "Who and why")
	return cmd
}

func modeText(m *control.Mode) string {
	if m == nil {
		return "configured"
	}
	return m.Mode
}

func topCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Lists the most-denied keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientOf(cmd)
			if err != nil {
				return err
			}
			n, _ := cmd.Flags().GetInt("n")
			var t Top
			if err := c.do("GET", "/rate_limit/top?n="+strconv.Itoa(n), nil, &t); err != nil || c.json {
				return err
			}
			var rows [][]string
			for _, e := range t.Keys {
				var path []string
				for _, p := range e.Path {
					path = append(path, p.Tier+"="+p.Value)
				}
				rows = append(rows, []string{strconv.FormatUint(e.Count, 10), "±" + strconv.FormatUint(e.Error, 10), e.Tree, strings.Join(path, " ")})
			}
			table(c.out, "DENIALS\tERROR\tTREE\tPATH", rows)
			fmt.Fprintf(c.out, "%d denials counted\n", t.Total)
			return nil
		},
	}
	cmd.Flags().IntP("n", "n", 20, "How many keys")
	return cmd
}

// ParseLimit parses a limit as the Caddyfile writes it: "<count>/<per>" or
// "<count> <dimension>/<per>", then optionally "burst <n>", an algorithm
// (gcra, sliding, sliding approx, calendar) and "tz <zone>".
func ParseLimit(s string) (*hierarchy.Limit, error) {
	const usage = `write e.g. "1000/h" or "100000 tokens/h burst 5000"`
	f := strings.Fields(s)
	if len(f) == 0 {
		return nil, fmt.Errorf("limit %q: empty; %s", s, usage)
	}
	l := &hierarchy.Limit{}
	count, per, ok := strings.Cut(f[0], "/")
	rest := f[1:]
	if !ok {
		if len(rest) == 0 {
			return nil, fmt.Errorf("limit %q: no period; %s", s, usage)
		}
		if l.Dimension, per, ok = strings.Cut(rest[0], "/"); !ok {
			return nil, fmt.Errorf("limit %q: no period; %s", s, usage)
		}
		rest = rest[1:]
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(count, "_", ""), 10, 64)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("limit %q: count %q must be a positive whole number", s, count)
	}
	l.Count, l.Per = n, per
	for len(rest) > 0 {
		switch w := rest[0]; w {
		case "burst", "tz":
			if len(rest) < 2 {
				return nil, fmt.Errorf("limit %q: %s needs a value", s, w)
			}
			if w == "tz" {
				l.Timezone = rest[1]
			} else if l.Burst, err = strconv.ParseInt(rest[1], 10, 64); err != nil || l.Burst <= 0 {
				return nil, fmt.Errorf("limit %q: burst %q must be a positive whole number", s, rest[1])
			}
			rest = rest[2:]
		case "gcra", "sliding", "calendar", "sliding_approx":
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
