package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the result as one indented JSON document.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// WriteText writes the result as tables for people; name and against
// name the configurations.
func (res *Result) WriteText(w io.Writer, name, against string) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "Read %d lines: %d malformed", res.Lines, res.Malformed)
	if res.Other > 0 {
		fmt.Fprintf(ew, ", %d not access log entries (skipped)", res.Other)
	}
	if res.Outside > 0 {
		fmt.Fprintf(ew, ", %d requests outside --from/--to", res.Outside)
	}
	fmt.Fprintln(ew, ".")
	for _, m := range res.MalformedLines {
		fmt.Fprintf(ew, "  malformed %s:%d: %s\n", m.File, m.Line, shown(m.Reason)) // it may quote the line
	}
	if res.Malformed > int64(len(res.MalformedLines)) {
		fmt.Fprintf(ew, "  (and %d more)\n", res.Malformed-int64(len(res.MalformedLines)))
	}
	fmt.Fprintln(ew)
	res.Report.writeText(ew, name)
	if res.Against != nil {
		fmt.Fprintln(ew)
		res.Against.writeText(ew, against)
		fmt.Fprintln(ew)
		res.Diff.writeText(ew, name, against)
	}
	return ew.err
}

func (rep *Report) writeText(w io.Writer, name string) {
	fmt.Fprintf(w, "== %s\n", name)
	if rep.Requests == 0 {
		fmt.Fprintln(w, "No requests replayed.")
		return
	}
	fmt.Fprintf(w, "%d requests from %s to %s: %d admitted (%d of them over a limit in warn or shadow mode), %d refused, %d with no limit applied",
		rep.Requests, stamp(rep.First), stamp(rep.Last), rep.Admitted, rep.WouldBlock, rep.Refused, rep.Unlimited)
	if rep.Undecided > 0 {
		fmt.Fprintf(w, ", %d not decided (refused):", rep.Undecided)
		for _, c := range rep.UndecidedBy {
			fmt.Fprintf(w, " %s %d", c.Reason, c.Count)
		}
	}
	fmt.Fprintln(w, ".")
	if len(rep.Trees) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TREE\tTIER\tMODE\tREQUESTS\tADMITTED\tREFUSED\tWOULD BLOCK\tHANDLER")
		for _, t := range rep.Trees {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", t.Tree, "(all)", t.Mode, t.Requests, t.Admitted, t.Refused, t.WouldBlock, t.Handler)
			for _, tier := range t.Tiers {
				fmt.Fprintf(tw, "\t%s\t\t%d\t%d\t%d\t%d\n", tier.Tier, tier.Requests, tier.Admitted, tier.Refused, tier.WouldBlock)
			}
		}
		_ = tw.Flush()
	}
	if len(rep.TopRefused) > 0 {
		fmt.Fprintln(w, "\nDenied most (refused, or would have been):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TREE\tTIER\tVALUE\tCOUNT\tFIRST")
		for _, v := range rep.TopRefused {
			count := strconv.FormatUint(v.Count, 10)
			if v.Error > 0 {
				count = fmt.Sprintf("≤%d (≥%d)", v.Count, v.Count-v.Error)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Tree, v.Tier, shownValue(v.Value, v.Missing), count, stamp(v.First))
		}
		_ = tw.Flush()
	}
	if len(rep.Peaks) > 0 {
		fmt.Fprintln(w, "\nPeak usage of each limit (who came closest):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TREE\tTIER\tLIMIT\tPEAK\tVALUE\tAT")
		for _, p := range rep.Peaks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f%%\t%s\t%s\n", p.Tree, p.Tier, p.Limit, p.Share*100, shown(p.Value), stamp(p.At))
		}
		_ = tw.Flush()
	}
	if rep.Penalty > 0 || rep.MaxWait > 0 {
		fmt.Fprintln(w)
	}
	if rep.Penalty > 0 {
		fmt.Fprintf(w, "Penalty boxes denied %d requests that the limits alone would have admitted.\n", rep.Penalty)
	}
	if rep.MaxWait > 0 {
		fmt.Fprintf(w, "max_wait held %d requests instead of refusing them (the longest for %s).\n", rep.MaxWait, rep.MaxWaitLongest)
	}
	if len(rep.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range rep.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
}

func (d *Diff) writeText(w io.Writer, name, against string) {
	fmt.Fprintf(w, "== Difference\n%d requests denied by %s and not by %s; %d the reverse.\n", d.DeniedByNew, name, against, d.DeniedByOld)
	list := func(title string, ex []Example) {
		if len(ex) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tREQUEST\tDENIED BY\tVALUE\tLOG")
		for _, e := range ex {
			fmt.Fprintf(tw, "%s\t%s %s\t%s/%s\t%s\t%s:%d\n", stamp(e.Time), e.Method, shown(e.Path), e.Tree, e.Tier, shownValue(e.Value, e.Missing), e.File, e.Line)
		}
		_ = tw.Flush()
	}
	list("First denied by "+name+" only", d.NewExamples)
	list("First denied by "+against+" only", d.OldExamples)
}

// stamp is a time as the report shows it: UTC, to the millisecond.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// shown is a value in a table: "" (a shared bucket) as (shared), control
// characters escaped.
func shown(v string) string {
	if v == "" {
		return "(shared)"
	}
	if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return strconv.Quote(v)
	}
	return v
}

// shownValue is shown(v), or (missing) for a request without the key.
func shownValue(v string, missing bool) string {
	if missing {
		return "(missing)"
	}
	return shown(v)
}

// errWriter keeps the first error of its writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return len(b), nil
	}
	_, e.err = e.w.Write(b)
	return len(b), nil
}
