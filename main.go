// Command infera is the single binary of an Infera fleet; its role is chosen by
// subcommand (serve, worker, sim, ...). main wires flags to config, builds the
// logger, installs signal handling and maps errors to exit codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes: 1 for a runtime failure, 2 for a configuration error.
const (
	exitFailure = 1
	exitConfig  = 2
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	if err := app.Run(args); err != nil {
		fmt.Fprintf(stderr, "infera: %v\n", err)
		if errors.Is(err, config.ErrInvalid) {
			return exitConfig
		}
		var exitErr cli.ExitCoder
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode()
		}
		return exitFailure
	}
	return 0
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:            "infera",
		Usage:           "route an LLM engine fleet behind one OpenAI-compatible endpoint",
		Version:         version,
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		Commands: []*cli.Command{
			serveCommand(),
			workerCommand(),
			simCommand(),
			benchCommand(),
			tokenizeCommand(),
			kvdCommand(),
			versionCommand(),
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			fmt.Fprintln(c.App.Writer, "infera", version)
			return nil
		},
	}
}

// newLogger builds the process logger from the log flags; every component gets
// a child of it with its own "component" field.
func newLogger(cfg config.Log, w io.Writer) zerolog.Logger {
	level, err := zerolog.ParseLevel(cfg.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	if cfg.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}
