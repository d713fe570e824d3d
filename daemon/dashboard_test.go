package daemon

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDashboardMetrics: every metric the Grafana dashboard
// (deploy/grafana/dlfs.json) queries is one the daemon exports.
func TestDashboardMetrics(t *testing.T) {
	names := map[string]bool{}
	descs := make(chan *prometheus.Desc, 256)
	(&collector{}).Describe(descs)
	lat, err := newLatencies(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []prometheus.Collector{lat.read, lat.fuse, lat.peer} {
		v.Describe(descs)
	}
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	labels := map[string][]string{} // by metric
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
			if m[2] != "" {
				labels[m[1]] = strings.Split(m[2], ",")
			}
			for _, l := range labels[m[1]] {
				if l == "job" || l == "instance" {
					t.Errorf("%s has the label %s, which Prometheus keeps for the scrape target (it would become exported_%s)", m[1], l, l)
				}
			}
		}
	}

	b, err := os.ReadFile("../deploy/grafana/dlfs.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\bdlfs_[a-z_]+`)
	var exprs []string
	by := regexp.MustCompile(`\bby \(([^)]*)\)`)
	legend := regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, by.ReplaceAllString(tg.Expr, ""))
			// The labels grouped by and shown are the target's (instance),
			// a histogram's le, or one of the metrics queried.
			has := map[string]bool{"instance": true, "le": true}
			for _, m := range metric.FindAllString(tg.Expr, -1) {
				for _, suffix := range []string{"", "_bucket", "_count", "_sum"} {
					for _, l := range labels[strings.TrimSuffix(m, suffix)] {
						has[l] = true
					}
				}
			}
			var used []string
			for _, g := range by.FindAllStringSubmatch(tg.Expr, -1) {
				used = append(used, strings.Split(g[1], ",")...)
			}
			for _, g := range legend.FindAllStringSubmatch(tg.Legend, -1) {
				used = append(used, g[1])
			}
			for _, l := range used {
				if l = strings.TrimSpace(l); !has[l] {
					t.Errorf("panel %q groups by or shows the label %s, which its metrics lack (in %q, %q)", p.Title, l, tg.Expr, tg.Legend)
				}
			}
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs = append(exprs, q)
		}
	}
	used := 0
	for _, e := range exprs {
		for _, m := range metric.FindAllString(e, -1) {
			base := m
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if b, ok := strings.CutSuffix(m, suffix); ok && names[b] {
					base = b
				}
			}
			if !names[base] {
				t.Errorf("the dashboard queries %s, which dlfs does not export (in %q)", m, e)
			}
			used++
		}
	}
	if len(dash.Panels) < 10 || used < 15 {
		t.Errorf("%d panels querying %d metrics", len(dash.Panels), used)
	}
}
