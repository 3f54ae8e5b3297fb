package httpapi_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
)

// TestRESTPresetsAndBatches drives the presets and a JSON batch over REST (the gateway): a
// preset saved and listed, a batch of two images (base64) that names it, the batch read back
// with its jobs and counts, cancelled, and a bad batch refused with the item's field.
func TestRESTPresetsAndBatches(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{})
	path, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := do(t, "POST", d.URL+"/v1/presets", "application/json",
		strings.NewReader(`{"name": "tiny", "spec": {"resolution": 96, "steps": 2, "latentWindowSize": 3, "cache": "none"}}`))
	if code != http.StatusOK || !strings.Contains(string(body), `"updateTime"`) {
		t.Fatalf("save preset: %d %s", code, body)
	}
	if code, _, body := do(t, "GET", d.URL+"/v1/presets", "", nil); code != http.StatusOK || !strings.Contains(string(body), `"name":"tiny"`) {
		t.Fatalf("list presets: %d %s", code, body)
	}
	b64 := base64.StdEncoding.EncodeToString(img)
	req := fmt.Sprintf(`{"batchId": "rest-1", "spec": {"prompt": "a cat", "totalSecondLength": 4, "preset": "tiny"},
		"items": [{"image": %q}, {"image": %q, "spec": {"seed": "9"}}]}`, b64, b64)
	code, _, body = do(t, "POST", d.URL+"/v1/batches", "application/json", strings.NewReader(req))
	if code != http.StatusOK {
		t.Fatalf("submit batch: %d %s", code, body)
	}
	var sub struct {
		Batch struct {
			BatchID string `json:"batchId"`
			Jobs    []struct {
				ID   string `json:"id"`
				Spec struct {
					Steps   int    `json:"steps"`
					Seed    string `json:"seed"`
					Preset  string `json:"preset"`
					BatchID string `json:"batchId"`
				} `json:"spec"`
			} `json:"jobs"`
		} `json:"batch"`
	}
	if err := json.Unmarshal(body, &sub); err != nil {
		t.Fatal(err)
	}
	jb := sub.Batch.Jobs
	if sub.Batch.BatchID != "rest-1" || len(jb) != 2 || jb[0].Spec.Steps != 2 || jb[0].Spec.Preset != "tiny" || jb[1].Spec.Seed != "9" || jb[1].Spec.BatchID != "rest-1" {
		t.Fatalf("batch: %s", body)
	}
	if code, _, body := do(t, "GET", d.URL+"/v1/batches/rest-1", "", nil); code != http.StatusOK || !strings.Contains(string(body), jb[1].ID) {
		t.Fatalf("get batch: %d %s", code, body)
	}
	if code, _, body := do(t, "POST", d.URL+"/v1/batches/rest-1:cancel", "application/json", strings.NewReader(`{}`)); code != http.StatusOK ||
		!strings.Contains(string(body), `"batchId":"rest-1"`) {
		t.Fatalf("cancel batch: %d %s", code, body)
	}
	code, _, body = do(t, "POST", d.URL+"/v1/batches", "application/json",
		strings.NewReader(fmt.Sprintf(`{"batchId": "rest-2", "spec": {"prompt": "a cat", "totalSecondLength": 1}, "items": [{"image": %q, "spec": {"steps": 500}}]}`, b64)))
	if code != http.StatusBadRequest || !strings.Contains(string(body), "items[0].spec.steps") {
		t.Fatalf("bad batch: %d %s", code, body)
	}
	if code, _, _ := do(t, "GET", d.URL+"/v1/batches/rest-2", "", nil); code != http.StatusNotFound {
		t.Fatalf("a refused batch exists: %d", code)
	}
}
