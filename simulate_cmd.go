package cascade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/spf13/cobra"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/simulate"
)

func init() {
	admin.AddSubcommand(simulateCommand)
}

// simulateCommand is `caddy rate-limit simulate`. It takes the parent's
// --config, --adapter and --json.
func simulateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulate --config <file> --log <file>... [--format caddy|combined|jsonl] [--against <file>] [--from <time>] [--to <time>]",
		Short: "Replays access logs through a configuration's rate limits, offline",
		Long: `Replays access logs through the rate_limit handlers of a configuration,
each request at its logged time, on the real engine with a simulated clock
and memory stores, and reports who the limits would have refused.

--config (and --adapter) name the configuration; --log the logs (repeat it,
or give several after one --log), gzip or not, merged in time order. The
format is detected from each file's first line unless --format says it:
caddy (Caddy's JSON access log), combined (Common or Combined Log Format)
or jsonl (one request a line; see docs/rollout.md). --against runs a second
configuration over the same requests and reports where the two differ.
--from and --to (RFC 3339, or a date) bound the requests replayed: --from
included, --to excluded. --host gives the requests logged without a Host
(Common and Combined logs) one, for the routes that match a site's host.
--window (1 to 1,000,000 lines) and --top (1 to 10,000) bound what is held
in memory. See docs/rollout.md.`,
		Args: cobra.ArbitraryArgs, // more logs: a shell's glob after --log
		RunE: runSimulate,
	}
	fl := cmd.Flags()
	fl.StringSlice("log", nil, "Access log files to replay (repeatable)")
	fl.String("format", "", "Log format: caddy, combined or jsonl (default: detected)")
	fl.String("against", "", "A second configuration to compare with")
	fl.String("against-adapter", "", "The config adapter of --against")
	fl.String("from", "", "Replay requests from this time (RFC 3339 or 2006-01-02)")
	fl.String("to", "", "Replay requests before this time (RFC 3339 or 2006-01-02)")
	fl.String("host", "", "The Host of the requests logged without one (the Common and Combined Log Formats)")
	fl.Int("window", simulate.DefaultWindow, "How many lines a log's requests may be out of time order by")
	fl.Int("top", 20, "How many values and examples the report lists")
	fl.Bool("quiet", false, "No progress line on stderr")
	return cmd
}

// maxTop bounds --top (the report's lists, and the sketch that finds the
// values denied most, ten times as large, are held in memory), maxWindow
// --window (its requests are).
const (
	maxTop    = 10000
	maxWindow = 1_000_000
)

func runSimulate(cmd *cobra.Command, args []string) error {
	fl := cmd.Flags()
	config, _ := fl.GetString("config")
	adapter, _ := fl.GetString("adapter")
	logs, _ := fl.GetStringSlice("log")
	format, _ := fl.GetString("format")
	against, _ := fl.GetString("against")
	againstAdapter, _ := fl.GetString("against-adapter")
	from, _ := fl.GetString("from")
	to, _ := fl.GetString("to")
	window, _ := fl.GetInt("window")
	top, _ := fl.GetInt("top")
	quiet, _ := fl.GetBool("quiet")
	host, _ := fl.GetString("host")
	asJSON, _ := fl.GetBool("json")
	if config == "" {
		return errors.New("give the configuration to simulate: --config <Caddyfile or JSON>")
	}
	logs = append(logs, args...)
	if len(logs) == 0 {
		return errors.New("give the access logs to replay: --log <file>")
	}
	if window < 1 || window > maxWindow {
		return fmt.Errorf("--window %d: give how many lines a log's requests may be out of order by, from 1 to %d", window, maxWindow)
	}
	if top < 1 || top > maxTop {
		return fmt.Errorf("--top %d: give how many values the report lists, from 1 to %d", top, maxTop)
	}
	opts := simulate.Options{Files: logs, Window: window, Top: top}
	var err error
	if opts.Format, err = simulate.ParseFormat(format); err != nil {
		return err
	}
	if opts.From, err = parseSimTime(from, "--from"); err != nil {
		return err
	}
	if opts.To, err = parseSimTime(to, "--to"); err != nil {
		return err
	}
	if !opts.From.IsZero() && !opts.To.IsZero() && !opts.From.Before(opts.To) {
		return fmt.Errorf("--from %s is not before --to %s: no request would be replayed (--from is included, --to excluded)", from, to)
	}
	if !quiet {
		opts.Progress = cmd.ErrOrStderr()
	}
	cmd.SilenceUsage = true
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return simulateFiles(ctx, cmd.OutOrStdout(), opts, simFiles{config: config, adapter: adapter, against: against, againstAdapter: againstAdapter, host: host}, asJSON)
}

// simFiles are the configurations a simulation compares, and what it
// gives the requests a log does not say.
type simFiles struct {
	config, adapter         string
	against, againstAdapter string // no against: one configuration
	host                    string // --host
}

// simulateFiles replays opts' logs through the configuration in file
// config (and against, if given) and writes the report to out.
func simulateFiles(ctx context.Context, out io.Writer, opts simulate.Options, f simFiles, asJSON bool) error {
	config, against := f.config, f.against
	sim, err := loadSimulation(config, f.adapter)
	if errors.Is(err, errNotJSON) {
		return fmt.Errorf("%w (for a Caddyfile, give --adapter caddyfile)", err)
	}
	if err != nil {
		return err
	}
	defer sim.Close()
	sim.host = f.host
	var old *simulation
	if against != "" {
		if old, err = loadSimulation(against, f.againstAdapter); errors.Is(err, errNotJSON) {
			return fmt.Errorf("--against: %w (for a Caddyfile, give --against-adapter caddyfile)", err)
		} else if err != nil {
			return fmt.Errorf("--against: %w", err)
		}
		defer old.Close()
		old.host = f.host
	}
	var oldDecider simulate.Decider
	if old != nil {
		oldDecider = old
	}
	res, err := simulate.Run(ctx, opts, sim, oldDecider)
	if err != nil {
		return err
	}
	if asJSON {
		return res.WriteJSON(out)
	}
	return res.WriteText(out, config, against)
}

// loadSimulation adapts and provisions the configuration in a file: a
// Caddyfile (by --adapter, or its name: Caddyfile, *.caddyfile) or JSON.
func loadSimulation(file, adapter string) (*simulation, error) {
	body, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	base := filepath.Base(file)
	if adapter == "" && (strings.HasPrefix(base, "Caddyfile") || filepath.Ext(base) == ".caddyfile") {
		adapter = "caddyfile"
	}
	if adapter != "" {
		a := caddyconfig.GetAdapter(adapter)
		if a == nil {
			return nil, fmt.Errorf("%s: no config adapter %q", file, adapter)
		}
		if body, _, err = a.Adapt(body, map[string]any{"filename": file}); err != nil {
			return nil, fmt.Errorf("%s: adapting with %s: %w", file, adapter, err)
		}
	}
	sim, err := newSimulation(body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return sim, nil
}

// parseSimTime reads --from or --to: RFC 3339, or a date (midnight UTC).
func parseSimTime(s, flag string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%s %q: give an RFC 3339 time (2026-11-20T09:00:00Z) or a date (2026-11-20)", flag, s)
}
