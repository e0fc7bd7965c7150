// Package msgpackx holds the msgpack reading helpers that kvcache's event
// decoder and kvd's frame decoder share: a Reader over one payload, built on
// vmihailenco/msgpack's streaming primitives over a bytes.Reader it owns, so
// str and bin values are sliced from the payload instead of copied; type
// peeks; and a skip of any value with a nesting bound (the library's own
// Skip recurses without one, which a hostile payload of nested arrays would
// turn into a stack overflow). Lengths read from the payload are checked
// against the bytes left before anything is sized by them.
//
// It is a leaf: no Infera imports. A Reader is not safe for concurrent use;
// each decoder owns one, and it allocates nothing once made.
package msgpackx
