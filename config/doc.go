// Package config owns the typed configuration of every Infera role (serve,
// worker, sim, ...): defaults, command-line flags, their INFERA_* environment
// variables (precedence: flag > env > default) and validation that reports every
// problem at once.
//
// Each default is declared once, at its flag. DefaultServe and DefaultSim
// return a role's configuration at its flag defaults; the components map
// those (router.DefaultConfig, router.DefaultKVAwareConfig), so a
// component's zero value means zero, never "default".
//
// Concurrency: config values are plain structs filled once at start-up and then
// only read; they are safe to share after Validate returns.
package config
