package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/infera/infera/bench"
	"github.com/infera/infera/config"
)

// errAllFailed makes `infera bench` exit non-zero when not one request
// succeeded, so scripts notice a dead or misconfigured target; the report is
// still printed and written first.
var errAllFailed = errors.New("every request failed")

func benchCommand() *cli.Command {
	var cfg config.Bench
	var plot config.BenchPlot
	return &cli.Command{
		Name:      "bench",
		Usage:     "load an OpenAI-compatible endpoint and report TTFT, ITL, throughput and cache hits",
		UsageText: "infera bench [flags]\n   infera bench plot [flags] REPORT.json [REPORT.json ...]",
		Flags:     cfg.Flags(),
		Subcommands: []*cli.Command{{
			Name:      "plot",
			Usage:     "draw the TTFT CDFs of several `infera bench --json` reports on one SVG chart",
			ArgsUsage: "REPORT.json [REPORT.json ...]",
			Flags:     plot.Flags(),
			Action: func(c *cli.Context) error {
				// urfave/cli stops parsing flags at the first file name; the
				// documented form puts -o after the files, so read those here.
				files, err := plotArgs(&plot, c.Args().Slice())
				if err != nil {
					return err
				}
				if err := plot.Validate(); err != nil {
					return err
				}
				if len(files) == 0 {
					return fmt.Errorf("%w: bench plot needs at least one JSON report", config.ErrInvalid)
				}
				return runBenchPlot(&plot, files)
			},
		}},
		Action: func(c *cli.Context) error {
			cfg.Finish(c)
			if err := cfg.Validate(); err != nil {
				return err
			}
			if c.Args().Present() {
				return fmt.Errorf("%w: unexpected argument %q (flags only, or the plot subcommand)", config.ErrInvalid, c.Args().First())
			}
			return runBench(c, &cfg)
		},
	}
}

func runBench(c *cli.Context, cfg *config.Bench) error {
	log := newLogger(cfg.Log, c.App.ErrWriter).With().Str("component", "bench").Logger()
	ctx, stop := signalContext(c.Context)
	defer stop()
	opts := bench.Options{
		URLs: cfg.URLs, Model: cfg.Model, APIKey: cfg.APIKey, Endpoint: cfg.Endpoint, Stream: cfg.Stream, Seed: cfg.Seed,
		Requests: cfg.Requests, Duration: cfg.Duration, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		MaxInflight: cfg.MaxInflight, Timeout: cfg.Timeout,
		Workload: cfg.Workload, InputLen: cfg.InputLen, OutputLen: cfg.OutputLen, LenSpread: cfg.LenSpread,
		PrefixGroups: cfg.PrefixGroups, PrefixLen: cfg.PrefixLen, SuffixLen: cfg.SuffixLen,
		Sessions: cfg.Sessions, Turns: cfg.Turns,
		TracePath: cfg.Trace, TraceTimeScale: cfg.TraceTimeScale, TraceLimit: cfg.TraceLimit, TraceBlockWords: cfg.TraceBlockWords, IgnoreEOS: cfg.IgnoreEOS,
		Label: cfg.Label,
	}
	if cfg.Progress {
		opts.Progress = c.App.ErrWriter
		opts.ProgressInterval = time.Second
	}
	rep, err := bench.Run(ctx, opts, log)
	if err != nil {
		if errors.Is(err, bench.ErrInvalidOptions) {
			return fmt.Errorf("%w: %w", config.ErrInvalid, err)
		}
		return fmt.Errorf("bench: %w", err)
	}
	if err := rep.WriteText(c.App.Writer); err != nil {
		return err
	}
	if cfg.JSON != "" {
		if err := rep.WriteJSONFile(cfg.JSON); err != nil {
			return err
		}
	}
	if cfg.Plot != "" {
		if err := writePlot(cfg.Plot, "TTFT CDF — "+rep.Config.Label, []bench.Series{bench.SeriesOf(rep, "")}); err != nil {
			return err
		}
	}
	if rep.Requests > 0 && rep.Completed == 0 {
		return fmt.Errorf("bench: %w (%d requests)", errAllFailed, rep.Requests)
	}
	return nil
}

// plotArgs separates the report files from -o/--output and --title flags
// given after them.
func plotArgs(cfg *config.BenchPlot, args []string) ([]string, error) {
	var files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(files, args[i+1:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || a == "-" {
			files = append(files, a)
			continue
		}
		var dest *string
		switch name {
		case "o", "output":
			dest = &cfg.Output
		case "title":
			dest = &cfg.Title
		default:
			return nil, fmt.Errorf("%w: bench plot: unknown flag %q", config.ErrInvalid, a)
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("%w: bench plot: %s needs a value", config.ErrInvalid, a)
			}
			i++
			value = args[i]
		}
		*dest = value
	}
	return files, nil
}

func runBenchPlot(cfg *config.BenchPlot, paths []string) error {
	reports := make([]*bench.Report, len(paths))
	seen := map[string]int{}
	for i, p := range paths {
		r, err := bench.ReadReportFile(p)
		if err != nil {
			return fmt.Errorf("bench plot: %w", err)
		}
		reports[i] = r
		seen[r.Config.Label]++
	}
	series := make([]bench.Series, len(paths))
	for i, r := range reports {
		label := ""
		if r.Config.Label == "" || seen[r.Config.Label] > 1 {
			// Runs with the same label (the same workload on the same host)
			// are told apart by their file names.
			label = strings.TrimSuffix(filepath.Base(paths[i]), filepath.Ext(paths[i]))
		}
		series[i] = bench.SeriesOf(r, label)
	}
	return writePlot(cfg.Output, cfg.Title, series)
}

func writePlot(path, title string, series []bench.Series) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create plot: %w", err)
	}
	if err := bench.WriteCDFSVG(f, title, "TTFT (ms)", series); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close plot: %w", err)
	}
	return nil
}
