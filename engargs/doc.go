// Package engargs reads inference engines' command lines the way their
// Python argparse parsers do, for the worker's engine adapters (engines)
// and the simulator's engine facades (sim) alike: flag spelling (--name,
// -name, --name=value, "_" for "-" in names), which arguments are flags
// (negative numbers are values; nothing after "--" is a flag), taking a
// flag's value, and JSON-valued flags such as --kv-events-config in whole
// and in vLLM's dotted form (--kv-events-config.endpoint tcp://*:5557),
// merged into one object.
//
// Concurrency: pure functions over the caller's slices; JSON values are
// freshly built maps owned by the caller.
package engargs
