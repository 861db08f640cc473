// promcheck reads a Prometheus text exposition (format 0.0.4) on stdin with
// Go's expfmt, the parser Prometheus's Go tooling (promtool, client_golang,
// the Gateway API inference extension's endpoint picker) uses, and prints
// one line per metric family: "NAME TYPE SAMPLES". A parse error is
// printed and the exit status is 1.
package main

import (
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/common/expfmt"
)

func main() {
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(os.Stdin)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := fams[n]
		fmt.Printf("%s %s %d\n", n, f.GetType().String(), len(f.GetMetric()))
	}
}
