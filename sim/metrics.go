package sim

import (
	"math"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
)

// metrics serves GET /metrics in the Prometheus text format with vLLM's
// metric names, HELP texts and labels (engine, model_name), so that the
// worker's drain logic and the router read the simulator exactly as they
// read vLLM. Counters are in tokens, as vLLM counts them.
func (s *Server) metrics(ctx *fasthttp.RequestCtx) {
	if s.cfg.Flavor == config.FlavorSGLang {
		s.sglangMetrics(ctx)
		return
	}
	p := &s.sched.pub
	bp := getBuf()
	b := (*bp)[:0]
	b = s.appendMetric(b, "vllm:num_requests_running", "gauge",
		"Number of requests in model execution batches.", float64(p.running.Load()+s.hung.Load()))
	b = s.appendMetric(b, "vllm:num_requests_waiting", "gauge",
		"Number of requests waiting to be processed.", float64(p.waiting.Load()))
	b = s.appendMetric(b, "vllm:kv_cache_usage_perc", "gauge",
		"KV-cache usage. 1 means 100 percent usage.", math.Float64frombits(p.usageBits.Load()))
	b = s.appendMetric(b, "vllm:prefix_cache_queries_total", "counter",
		"Prefix cache queries, in terms of number of queried tokens.", float64(p.queries.Load()))
	b = s.appendMetric(b, "vllm:prefix_cache_hits_total", "counter",
		"Prefix cache hits, in terms of number of cached tokens.", float64(p.hits.Load()))
	b = s.appendMetric(b, "vllm:prompt_tokens_total", "counter",
		"Number of prefill tokens processed.", float64(p.promptTokens.Load()))
	b = s.appendMetric(b, "vllm:generation_tokens_total", "counter",
		"Number of generation tokens processed.", float64(p.genTokens.Load()))

	b = append(b, "# HELP vllm:request_success_total Count of successfully processed requests.\n"+
		"# TYPE vllm:request_success_total counter\nvllm:request_success_total{"...)
	b = append(b, s.labels...)
	b = append(b, `,finished_reason="length"} `...)
	b = appendPromFloat(b, float64(p.success.Load()))

	b = append(b, "\n# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"+
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\""...)
	b = strconv.AppendInt(b, int64(s.cfg.BlockSize), 10)
	b = append(b, `",cache_dtype="auto",enable_prefix_caching="True",`...)
	b = append(b, s.labels...)
	b = append(b, `,num_gpu_blocks="`...)
	b = strconv.AppendInt(b, int64(s.cfg.KVBlocks), 10)
	b = append(b, "\"} 1.0\n"...)
	b = s.appendDPRanks(b)
	b = s.appendPDMetrics(b)
	b = s.appendModelMetrics(b)
	b = s.appendKVDMetrics(b)

	ctx.SetContentType(contentProm)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

// sglangMetrics serves /metrics with SGLang's names (--flavor sglang), as
// SGLang does with --enable-metrics: the label is model_name only.
func (s *Server) sglangMetrics(ctx *fasthttp.RequestCtx) {
	p := &s.sched.pub
	bp := getBuf()
	b := (*bp)[:0]
	hitRate := 0.0
	if q := p.queries.Load(); q > 0 {
		hitRate = float64(p.hits.Load()) / float64(q)
	}
	b = s.appendMetric(b, "sglang:num_running_reqs", "gauge", "The number of running requests.",
		float64(p.running.Load()+s.hung.Load()))
	b = s.appendMetric(b, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
		float64(p.waiting.Load()))
	b = s.appendMetric(b, "sglang:token_usage", "gauge", "The token usage.",
		math.Float64frombits(p.usageBits.Load()))
	b = s.appendMetric(b, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", hitRate)
	b = s.appendMetric(b, "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
		float64(p.promptTokens.Load()))
	b = s.appendMetric(b, "sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
		float64(p.genTokens.Load()))
	b = s.appendMetric(b, "sglang:num_requests_total", "counter", "Number of requests processed.",
		float64(p.success.Load()))
	b = s.appendDPRanks(b)
	b = s.appendPDMetrics(b)
	ctx.SetContentType(contentProm)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

func (s *Server) appendMetric(b []byte, name, typ, help string, v float64) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, help...)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	b = append(b, '\n')
	b = append(b, name...)
	b = append(b, '{')
	b = append(b, s.labels...)
	b = append(b, "} "...)
	b = appendPromFloat(b, v)
	return append(b, '\n')
}

// appendPromFloat formats like Python's prometheus_client (which vLLM
// uses): integral values keep a ".0".
func appendPromFloat(b []byte, v float64) []byte {
	b = strconv.AppendFloat(b, v, 'f', -1, 64)
	if v == math.Trunc(v) && !math.IsInf(v, 0) {
		b = append(b, ".0"...)
	}
	return b
}

// promEscape escapes a Prometheus label value.
func promEscape(v string) []byte {
	var b []byte
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, '\\', '\\')
		case '"':
			b = append(b, '\\', '"')
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, c)
		}
	}
	return b
}
