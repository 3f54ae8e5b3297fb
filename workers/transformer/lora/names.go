package lora

import (
	"regexp"
	"strings"
)

// originalBlockModules maps a module of an original HunyuanVideo block (in the form with _ for .,
// so kohya keys of original names resolve too) to our modules, in the row order of the fused
// up weight, as diffusers' _convert_hunyuan_video_lora_to_diffusers maps them.
var originalDouble = map[string][]string{
	"img_attn_qkv":   {"attn.to_q", "attn.to_k", "attn.to_v"},
	"txt_attn_qkv":   {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"},
	"img_attn_proj":  {"attn.to_out.0"},
	"txt_attn_proj":  {"attn.to_add_out"},
	"img_mod_linear": {"norm1.linear"},
	"txt_mod_linear": {"norm1_context.linear"},
	"img_mlp_fc1":    {"ff.net.0.proj"},
	"img_mlp_fc2":    {"ff.net.2"},
	"txt_mlp_fc1":    {"ff_context.net.0.proj"},
	"txt_mlp_fc2":    {"ff_context.net.2"},
}

// originalSingle: linear1 is q, k, v and the MLP input fused (3·dim + mlp rows).
var originalSingle = map[string][]string{
	"linear1":           {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"},
	"linear2":           {"proj_out"},
	"modulation_linear": {"norm.linear"},
}

var originalRefiner = map[string][]string{
	"self_attn_qkv":      {"attn.to_q", "attn.to_k", "attn.to_v"},
	"self_attn_proj":     {"attn.to_out.0"},
	"mlp_fc1":            {"ff.net.0.proj"},
	"mlp_fc2":            {"ff.net.2"},
	"adaLN_modulation_1": {"norm_out.linear"},
}

var originalTop = map[string][]string{
	"img_in_proj":                    {"x_embedder.proj"},
	"time_in_mlp_0":                  {"time_text_embed.timestep_embedder.linear_1"},
	"time_in_mlp_2":                  {"time_text_embed.timestep_embedder.linear_2"},
	"guidance_in_mlp_0":              {"time_text_embed.guidance_embedder.linear_1"},
	"guidance_in_mlp_2":              {"time_text_embed.guidance_embedder.linear_2"},
	"vector_in_in_layer":             {"time_text_embed.text_embedder.linear_1"},
	"vector_in_out_layer":            {"time_text_embed.text_embedder.linear_2"},
	"final_layer_linear":             {"proj_out"},
	"txt_in_input_embedder":          {"context_embedder.proj_in"},
	"txt_in_t_embedder_mlp_0":        {"context_embedder.time_text_embed.timestep_embedder.linear_1"},
	"txt_in_t_embedder_mlp_2":        {"context_embedder.time_text_embed.timestep_embedder.linear_2"},
	"txt_in_c_embedder_linear_1":     {"context_embedder.time_text_embed.text_embedder.linear_1"},
	"txt_in_c_embedder_linear_2":     {"context_embedder.time_text_embed.text_embedder.linear_2"},
	"final_layer_adaLN_modulation_1": {"norm_out.linear"}, // shift, scale → scale, shift (swapHalves)
}

var (
	reDouble  = regexp.MustCompile(`^double_blocks[._](\d+)[._](.+)$`)
	reSingle  = regexp.MustCompile(`^single_blocks[._](\d+)[._](.+)$`)
	reRefiner = regexp.MustCompile(`^txt_in[._]individual_token_refiner[._]blocks[._](\d+)[._](.+)$`)
)

func underscore(s string) string { return strings.ReplaceAll(s, ".", "_") }

// mapOriginal maps an original HunyuanVideo module name (dots or underscores) to our modules, in
// the row order of its up weight; swapHalves says the up's two row halves trade places
// (final_layer.adaLN_modulation.1 is shift, scale; norm_out.linear is scale, shift).
func mapOriginal(module string) (targets []string, swapHalves, ok bool) {
	prefixed := func(prefix string, subs []string) []string {
		out := make([]string, len(subs))
		for i, s := range subs {
			out[i] = prefix + s
		}
		return out
	}
	if m := reDouble.FindStringSubmatch(module); m != nil {
		if subs, ok := originalDouble[underscore(m[2])]; ok {
			return prefixed("transformer_blocks."+m[1]+".", subs), false, true
		}
		return nil, false, false
	}
	if m := reSingle.FindStringSubmatch(module); m != nil {
		if subs, ok := originalSingle[underscore(m[2])]; ok {
			return prefixed("single_transformer_blocks."+m[1]+".", subs), false, true
		}
		return nil, false, false
	}
	if m := reRefiner.FindStringSubmatch(module); m != nil {
		if subs, ok := originalRefiner[underscore(m[2])]; ok {
			return prefixed("context_embedder.token_refiner.refiner_blocks."+m[1]+".", subs), false, true
		}
		return nil, false, false
	}
	u := underscore(module)
	if subs, ok := originalTop[u]; ok {
		return subs, u == "final_layer_adaLN_modulation_1", true
	}
	return nil, false, false
}

// isOriginalName says whether a key without a prefix uses the original HunyuanVideo names.
func isOriginalName(module string) bool {
	_, _, ok := mapOriginal(module)
	return ok
}
