package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/infera/infera/config"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// tokenizeCommand is `infera tokenize`: the token ids and block hashes the
// kv-aware router computes for prompts, to see why a prefix did not hit.
func tokenizeCommand() *cli.Command {
	var cfg config.Tokenize
	return &cli.Command{
		Name:  "tokenize",
		Usage: "print the token ids (and KV block hashes) the router computes for JSON-line prompts on stdin",
		Description: "Each stdin line is {\"text\": \"...\"} (encoded as is, without special tokens) or, with --chat,\n" +
			"{\"messages\": [...]} (optionally with \"tools\" and \"chat_template_kwargs\"), rendered with the\n" +
			"chat template and add_generation_prompt=true, as the router does for /v1/chat/completions.\n" +
			"Each prompt gives one line {\"ids\":[...]} with \"hashes\" (16 hex digits each) when --block-size\n" +
			"is set; a bad line gives {\"line\":N,\"error\":\"...\"} and the command exits 1 at the end.\n\n" +
			"Example: echo '{\"text\":\"hello\"}' | infera tokenize --tokenizer bytes --block-size 2",
		Flags: cfg.Flags(),
		Action: func(c *cli.Context) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			tok, err := tokenizer.Open(cfg.Tokenizer)
			if err != nil {
				return fmt.Errorf("open tokenizer: %w", err)
			}
			return runTokenize(cfg, tok, c.App.Reader, c.App.Writer)
		},
	}
}

var errTokenizeLines = errors.New("tokenize failed")

// maxTokenizeLine bounds one input line.
const maxTokenizeLine = 64 << 20

// tokenizeInput is one stdin line.
type tokenizeInput struct {
	Text               *string         `json:"text"`
	Messages           json.RawMessage `json:"messages"`
	Tools              json.RawMessage `json:"tools"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

func runTokenize(cfg config.Tokenize, tok tokenizer.Tokenizer, in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxTokenizeLine)
	w := bufio.NewWriter(out)
	var (
		ids    []uint32
		hashes []uint64
		buf    []byte
		lines  int
		failed int
	)
	for sc.Scan() {
		lines++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var err error
		ids, err = tokenizeLine(cfg, tok, line, ids[:0])
		buf = buf[:0]
		if err != nil {
			failed++
			buf = append(buf, `{"line":`...)
			buf = strconv.AppendInt(buf, int64(lines), 10)
			buf = append(buf, `,"error":`...)
			buf = openai.AppendQuoted(buf, "line "+strconv.Itoa(lines)+": "+err.Error())
			buf = append(buf, "}\n"...)
		} else {
			buf = append(buf, `{"ids":[`...)
			for i, id := range ids {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = strconv.AppendUint(buf, uint64(id), 10)
			}
			buf = append(buf, ']')
			if cfg.BlockSize > 0 {
				hashes = kvcache.AppendBlockHashes(hashes[:0], ids, cfg.BlockSize)
				buf = append(buf, `,"hashes":[`...)
				for i, h := range hashes {
					if i > 0 {
						buf = append(buf, ',')
					}
					buf = appendHash(buf, h)
				}
				buf = append(buf, ']')
			}
			buf = append(buf, "}\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read input after line %d: %w", lines, err)
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of the input lines were rejected", errTokenizeLines, failed)
	}
	return nil
}

// tokenizeLine encodes one input line.
func tokenizeLine(cfg config.Tokenize, tok tokenizer.Tokenizer, line []byte, dst []uint32) ([]uint32, error) {
	var in tokenizeInput
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return dst, fmt.Errorf("want a JSON object with \"text\" or \"messages\": %w", err)
	}
	if dec.More() {
		return dst, errors.New("trailing data after the JSON object")
	}
	hasMessages := len(in.Messages) > 0 && string(in.Messages) != "null"
	switch {
	case in.Text != nil && hasMessages:
		return dst, errors.New(`give "text" or "messages", not both`)
	case in.Text != nil:
		return tok.AppendEncode(dst, *in.Text), nil
	case !hasMessages:
		return dst, errors.New(`want "text" or "messages"`)
	case !cfg.Chat:
		return dst, errors.New(`"messages" needs --chat`)
	}
	text, err := tok.RenderChatRequest(tokenizer.Chat{Messages: in.Messages, Tools: in.Tools, Kwargs: in.ChatTemplateKwargs})
	if err != nil {
		return dst, fmt.Errorf("render chat: %w", err)
	}
	return tok.AppendEncode(dst, text), nil
}

// appendHash appends h as a JSON string of 16 hex digits.
func appendHash(dst []byte, h uint64) []byte {
	const digits = "0123456789abcdef"
	dst = append(dst, '"')
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[(h>>uint(shift))&0xf])
	}
	return append(dst, '"')
}
