package openai

import (
	"slices"
	"testing"
)

// FuzzImagePrecheck: skipping the walk when hasImageType says there is no
// image type never loses an image: VisitImages and the bare walk agree on
// every document.
func FuzzImagePrecheck(f *testing.F) {
	f.Add([]byte(`[{"content":[{"type":"image_url","image_url":{"url":"u"}}]}]`))
	f.Add([]byte(`[{"content":[{"type":"input_image","file_id":"f"}]}]`))
	f.Add([]byte(`[{"content":[{"type":"image\u005furl","image_url":"u"}]}]`))
	f.Add([]byte(`[{"content":"image_ur input_imag _image_"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var a, w [][]byte
		na := VisitImages(b, func(ref []byte) { a = append(a, slices.Clone(ref)) })
		nw := visitImageParts(b, func(ref []byte) { w = append(w, slices.Clone(ref)) })
		if na != nw || !slices.EqualFunc(a, w, slices.Equal) {
			t.Fatalf("%q: %d images %q, walk finds %d %q", b, na, a, nw, w)
		}
	})
}
