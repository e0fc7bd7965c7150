// Package config owns the typed configuration of every Infera role (serve,
// worker, sim, ...): defaults, command-line flags, their INFERA_* environment
// variables (precedence: flag > env > default) and validation that reports every
// problem at once.
//
// Concurrency: config values are plain structs filled once at start-up and then
// only read; they are safe to share after Validate returns.
package config
