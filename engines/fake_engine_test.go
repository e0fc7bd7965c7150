package engines

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// fakeEngineEnv switches the test binary into fake engine mode (see TestMain).
const fakeEngineEnv = "INFERA_ENGINES_TEST_FAKE_ENGINE"

// runFakeEngine is a minimal vLLM-like engine driven through files in its
// --state-dir, so tests control it without timing: "pid" is written at
// start; /health answers 503 while "unhealthy" exists; /metrics reports the
// integer in "running" as vllm:num_requests_running and prints one stdout
// line per scrape (which the worker captures into its log). Its
// vllm:cache_config_info reports --metrics-block-size, else --block-size,
// and num_gpu_blocks --metrics-kv-blocks when given.
// The mode (the value of fakeEngineEnv) says how it is invoked: "1" as the
// sim (`sim` first), "vllm" as `vllm serve`, "sglang" with SGLang's
// arguments only; in that mode it reports SGLang's metric names and answers
// /get_server_info with page_size --metrics-block-size (else 1) and a
// token pool of --metrics-kv-blocks pages.
func runFakeEngine(mode string, args []string) int {
	sglang := mode == "sglang"
	first := map[string]string{"1": "sim", "vllm": "serve"}[mode]
	if first != "" {
		if len(args) == 0 || args[0] != first {
			fmt.Fprintf(os.Stderr, "fake engine: want %q as the first argument\n", first)
			return 2
		}
		args = args[1:]
	}
	flags, err := parseEngineFlags(args, "host", "port", "state-dir", "block-size", "metrics-block-size", "metrics-kv-blocks")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake engine:", err)
		return 2
	}
	host, port, dir, blockSize := flags["host"], flags["port"], flags["state-dir"], flags["block-size"]
	if host == "" {
		host = "127.0.0.1"
	}
	if blockSize == "" {
		blockSize = "16"
	}
	if v := flags["metrics-block-size"]; v != "" {
		blockSize = v // an engine that resolves its block size itself
	}
	kvBlocks := ""
	if v := flags["metrics-kv-blocks"]; v != "" {
		kvBlocks = `,num_gpu_blocks="` + v + `"`
	}
	if dir == "" {
		fmt.Fprintln(os.Stderr, "fake engine: --state-dir is required")
		return 2
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "fake engine:", err)
		return 1
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake engine:", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := os.Stat(filepath.Join(dir, "unhealthy")); err == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/get_server_info", func(w http.ResponseWriter, _ *http.Request) {
		page := flags["metrics-block-size"]
		if page == "" {
			page = "1"
		}
		pool := 0
		if n, err := strconv.Atoi(flags["metrics-kv-blocks"]); err == nil {
			size, _ := strconv.Atoi(page)
			pool = n * size
		}
		fmt.Fprintf(w, `{"model_path":"m","server_args":{"page_size":%s},"max_total_num_tokens":%d,"version":"fake"}`, page, pool)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		running := 0
		if b, err := os.ReadFile(filepath.Join(dir, "running")); err == nil {
			running, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		fmt.Printf("metrics scraped running=%d\n", running)
		if sglang {
			fmt.Fprintf(w, "# HELP sglang:num_running_reqs The number of running requests.\n"+
				"# TYPE sglang:num_running_reqs gauge\n"+
				"sglang:num_running_reqs{model_name=\"fake\",engine_type=\"unified\",tp_rank=\"0\"} %d\n"+
				"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"+
				"# TYPE sglang:num_queue_reqs gauge\n"+
				"sglang:num_queue_reqs{model_name=\"fake\",engine_type=\"unified\",tp_rank=\"0\"} 0\n", running)
			return
		}
		fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"+
			"# TYPE vllm:num_requests_running gauge\n"+
			"vllm:num_requests_running{engine=\"0\",model_name=\"fake\"} %d\n"+
			"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"+
			"# TYPE vllm:num_requests_waiting gauge\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"fake\"} 0\n"+
			"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"+
			"# TYPE vllm:cache_config_info gauge\n"+
			"vllm:cache_config_info{block_size=\"%s\",engine=\"0\"%s} 1.0\n", running, blockSize, kvBlocks)
	})
	srv := &http.Server{Handler: mux}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "fake engine: terminating")
		_ = srv.Close()
	}()
	fmt.Fprintln(os.Stderr, "fake engine listening on", l.Addr())
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "fake engine:", err)
		return 1
	}
	return 0
}
