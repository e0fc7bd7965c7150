package config

import (
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"
)

// Tokenize configures `infera tokenize`, which shows the token ids and
// block hashes the router computes for a prompt.
type Tokenize struct {
	// Tokenizer is "bytes" or a Hugging Face tokenizer directory.
	Tokenizer string
	// Chat renders {"messages": [...]} inputs with the chat template
	// (add_generation_prompt=true) before encoding.
	Chat bool
	// BlockSize, when positive, adds the chained block hashes.
	BlockSize int
}

// Flags returns the tokenize flags.
func (t *Tokenize) Flags() []cli.Flag {
	return []cli.Flag{
		String("tokenizer", "\"bytes\" or a Hugging Face tokenizer directory (tokenizer.json, chat template)", &t.Tokenizer, ""),
		Bool("chat", "accept {\"messages\": [...]} lines, rendered with the chat template and add_generation_prompt=true", &t.Chat, false),
		Int("block-size", "also print the chained KV block hashes for this block size (0: ids only)", &t.BlockSize, 0),
	}
}

// Validate reports every configuration problem at once.
func (t *Tokenize) Validate() error {
	var p Problems
	switch t.Tokenizer {
	case "":
		p.Addf("--tokenizer is required: bytes or a tokenizer directory")
	case TokenizerBytes:
	default:
		if st, err := os.Stat(filepath.Join(t.Tokenizer, "tokenizer.json")); err != nil || !st.Mode().IsRegular() {
			p.Addf("--tokenizer %q: want bytes or a directory holding tokenizer.json", t.Tokenizer)
		}
	}
	if t.BlockSize < 0 || t.BlockSize > 1<<16 {
		p.Addf("--block-size must be from 0 to 65536")
	}
	return p.Err()
}
