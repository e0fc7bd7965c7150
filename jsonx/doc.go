// Package jsonx is Infera's one JSON layer below the protocol packages: a
// validating single-pass scanner (Scanner), string decoding
// (AppendUnescaped), string quoting (AppendQuoted, AppendQuotedRaw) and an
// append-style editor for the top-level fields of a JSON object
// (SetField, DeleteField) that works on the bytes without unmarshalling.
//
// It imports nothing outside the standard library and knows nothing about
// OpenAI, chat templates or engines; openai, tokenizer, sim and bench build
// their readers on it.
//
// Concurrency: everything is a pure function of its arguments or a method
// on a caller-owned Scanner value; nothing is shared, so distinct Scanners
// may be used from any number of goroutines. No function allocates except
// to grow a caller's dst, and the scanner allocates only the error it
// returns.
package jsonx
