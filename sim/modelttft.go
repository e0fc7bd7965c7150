package sim

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// --model-ttft-log PATH: one JSON line per request at its first token, with
// the modelled time to first token the step model gave it,
//
//	{"request_id":"…","prompt_tokens":N,"cached_tokens":N,"model_ttft_s":F,"model_admit_wait_s":F,"model_idle_ttft_s":F,"model_clock_s":F}
//
// request_id is the X-Request-Id the request came with ("" without one),
// cached_tokens the prompt tokens served from the prefix cache or loaded
// from kvd (the answer's cached_tokens), model_ttft_s the model-clock time
// from submission to the first token, model_admit_wait_s the part of it
// spent waiting to enter the batch (for free blocks or a batch slot, behind
// the requests before it: head-of-line, as vLLM admits), so that the rest,
// model_ttft_s − model_admit_wait_s, is the prefill queue the request sat in
// plus its own prefill; model_idle_ttft_s what the step model gives the
// same request alone on an idle engine (its uncached prompt prefilled a
// step budget at a time: the part of its TTFT that no routing or queueing
// removes once its cache hits are given; kvd loads not counted) and
// model_clock_s the model clock at the first token, all four in seconds of
// the model before --time-scale (0 at
// --time-scale 0). infera_sim_model_ttft_seconds_total is the sum of the
// lines' model_ttft_s; the lines give its distribution, which a benchmark
// on a loaded box reads instead of the measured TTFT's (the model's clock
// does not move with the box's load). A request with n > 1 choices is one
// line (its first choice's).
//
// The scheduler appends a line to a buffer under a mutex that the writer
// goroutine holds only to swap buffers, so a slow disk never delays a
// step; the writer writes every modelTTFTFlushEvery, sooner when a buffer
// passes modelTTFTFlushBytes, and once more at shutdown.

const (
	modelTTFTFlushEvery = 200 * time.Millisecond
	modelTTFTFlushBytes = 16 << 10
	// modelTTFTBufBytes is both buffers' initial capacity: room for four
	// flush thresholds, so a line is appended without growing the buffer
	// unless the writer falls that far behind.
	modelTTFTBufBytes = 64 << 10
)

type modelTTFTLog struct {
	f     *os.File
	scale float64 // --time-scale, to write model time unscaled

	mu   sync.Mutex
	buf  []byte // lines not yet handed to the writer
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	// Writer-owned.
	out []byte
	err error // the first failed write; later lines are dropped
}

// openModelTTFTLog creates (or truncates) path; nil for "".
func openModelTTFTLog(path string, scale float64) (*modelTTFTLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("model ttft log: %w", err)
	}
	return &modelTTFTLog{
		f: f, scale: scale,
		buf:  make([]byte, 0, modelTTFTBufBytes),
		out:  make([]byte, 0, modelTTFTBufBytes),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}, nil
}

// start runs the writer until close.
func (l *modelTTFTLog) start() {
	go l.run()
}

func (l *modelTTFTLog) run() {
	defer close(l.done)
	tick := time.NewTicker(modelTTFTFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			l.write()
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.write()
	}
}

// write hands the pending lines to the file.
func (l *modelTTFTLog) write() {
	l.mu.Lock()
	l.out, l.buf = l.buf, l.out[:0]
	l.mu.Unlock()
	if len(l.out) > 0 && l.err == nil {
		_, l.err = l.f.Write(l.out)
	}
}

// close writes what is left and closes the file; it returns the first
// write or close error. Call it after the scheduler stopped.
func (l *modelTTFTLog) close() error {
	if l == nil {
		return nil
	}
	close(l.stop)
	<-l.done
	if err := l.f.Close(); l.err == nil {
		l.err = err
	}
	if l.err != nil {
		return fmt.Errorf("model ttft log: %w", l.err)
	}
	return nil
}

// record appends q's line: its first token came at the model clock
// clockNs, ttftNs after it was submitted, of which it waited admitNs to
// enter the batch, and alone on an idle engine it would have come idleNs
// after (all scaled nanoseconds).
func (l *modelTTFTLog) record(q *seq, ttftNs, admitNs, idleNs, clockNs int64) {
	ttft, admit, idle, clock := 0.0, 0.0, 0.0, 0.0
	if l.scale > 0 {
		ttft, admit, idle, clock = float64(ttftNs)/1e9/l.scale, float64(admitNs)/1e9/l.scale, float64(idleNs)/1e9/l.scale, float64(clockNs)/1e9/l.scale
	}
	l.mu.Lock()
	b := append(l.buf, `{"request_id":`...)
	b = appendJSONString(b, q.requestID)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(q.promptLen), 10)
	b = append(b, `,"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(q.cached.Load()), 10)
	b = append(b, `,"model_ttft_s":`...)
	b = strconv.AppendFloat(b, ttft, 'f', 9, 64)
	b = append(b, `,"model_admit_wait_s":`...)
	b = strconv.AppendFloat(b, admit, 'f', 9, 64)
	b = append(b, `,"model_idle_ttft_s":`...)
	b = strconv.AppendFloat(b, idle, 'f', 9, 64)
	b = append(b, `,"model_clock_s":`...)
	b = strconv.AppendFloat(b, clock, 'f', 9, 64)
	b = append(b, "}\n"...)
	l.buf = b
	full := len(b) >= modelTTFTFlushBytes
	l.mu.Unlock()
	if full {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}
