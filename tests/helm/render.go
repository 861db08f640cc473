// render.go - renders a Helm chart the way `helm template` does, for tests
// on machines without Helm: Go text/template with the sprig functions plus
// Helm's own (include, tpl, required, toYaml, fromYaml, toJson, lookup),
// the built-in objects (.Values, .Release, .Chart, .Capabilities, .Files,
// .Template), values.yaml deep-merged with -f files and --set a.b=c, the
// chart's crds/ first, then every template that renders to something.
//
//	helm-render [-n NAMESPACE] [--name RELEASE] [-f values.yaml]... [--set k=v]... [--notes] CHART
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// merge copies src over dst: maps merge key by key, anything else replaces.
func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// setValue applies one --set a.b.c=v (v parsed as a YAML scalar).
func setValue(vals map[string]interface{}, expr string) error {
	eq := strings.Index(expr, "=")
	if eq < 1 {
		return fmt.Errorf("--set %q: want key=value", expr)
	}
	var v interface{}
	if err := yaml.Unmarshal([]byte(expr[eq+1:]), &v); err != nil {
		v = expr[eq+1:]
	}
	keys := strings.Split(expr[:eq], ".")
	m := vals
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return nil
}

func readYAML(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return out, nil
}

func toYAML(v interface{}) string {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// files gives templates .Files.Get and .Files.Glob-free access to the chart's files.
type files struct{ root string }

func (f files) Get(name string) string {
	data, err := os.ReadFile(filepath.Join(f.root, name))
	if err != nil {
		return ""
	}
	return string(data)
}

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

func main() {
	var valueFiles, sets multi
	ns := flag.String("n", "default", "release namespace")
	name := flag.String("name", "llm-operator", "release name")
	notes := flag.Bool("notes", false, "print NOTES.txt instead of the manifests")
	kubeVersion := flag.String("kube-version", "v1.30.0", "Capabilities.KubeVersion")
	var apis multi
	flag.Var(&valueFiles, "f", "values file (repeatable)")
	flag.Var(&sets, "set", "key=value (repeatable)")
	flag.Var(&apis, "api-versions", "extra Capabilities.APIVersions (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: helm-render [-n NS] [--name RELEASE] [-f values.yaml] [--set k=v] [--notes] CHART")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *ns, *name, *kubeVersion, valueFiles, sets, apis, *notes); err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(1)
	}
}

func run(chart, ns, release, kubeVersion string, valueFiles, sets, apis []string, notes bool) error {
	meta, err := readYAML(filepath.Join(chart, "Chart.yaml"))
	if err != nil {
		return err
	}
	vals, err := readYAML(filepath.Join(chart, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range valueFiles {
		v, err := readYAML(f)
		if err != nil {
			return err
		}
		merge(vals, v)
	}
	for _, s := range sets {
		if err := setValue(vals, s); err != nil {
			return err
		}
	}
	chartName, _ := meta["name"].(string)
	top := map[string]interface{}{
		"Values":  vals,
		"Release": map[string]interface{}{"Name": release, "Namespace": ns, "Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Chart": map[string]interface{}{"Name": chartName, "Version": fmt.Sprint(meta["version"]),
			"AppVersion": fmt.Sprint(meta["appVersion"])},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": kubeVersion, "GitVersion": kubeVersion},
			"APIVersions": apiVersions(append([]string{"v1", "apps/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
				"coordination.k8s.io/v1"}, apis...))},
		"Files": files{chart},
	}
	tpl := template.New("chart").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		out := map[string]interface{}{}
		_ = yaml.Unmarshal([]byte(s), &out)
		return out
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var b bytes.Buffer
		err := tpl.ExecuteTemplate(&b, name, data)
		return b.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := tpl.Clone()
		if err == nil {
			t, err = t.New("tpl").Parse(text)
		}
		var b bytes.Buffer
		if err == nil {
			err = t.Execute(&b, data)
		}
		return b.String(), err
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["lookup"] = func(...string) map[string]interface{} { return map[string]interface{}{} }
	tpl.Funcs(funcs)
	paths, _ := filepath.Glob(filepath.Join(chart, "templates", "*"))
	sort.Strings(paths)
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if _, err := tpl.New(chartName + "/templates/" + filepath.Base(p)).Parse(string(data)); err != nil {
			return err
		}
	}
	var out bytes.Buffer
	if notes {
		return render(tpl, chartName+"/templates/NOTES.txt", top, &out, false)
	}
	crds, _ := filepath.Glob(filepath.Join(chart, "crds", "*.yaml"))
	sort.Strings(crds)
	for _, p := range crds {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&out, "---\n# Source: %s/crds/%s\n%s", chartName, filepath.Base(p), strings.TrimPrefix(string(data), "---\n"))
	}
	for _, p := range paths {
		base := filepath.Base(p)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" || !(strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")) {
			continue
		}
		if err := render(tpl, chartName+"/templates/"+base, top, &out, true); err != nil {
			return err
		}
	}
	_, err = os.Stdout.WriteString(ordered("\n" + out.String()))
	return err
}

// installOrder is the order Helm applies kinds in (unknown kinds last).
var installOrder = strings.Fields(`Namespace NetworkPolicy ResourceQuota LimitRange PodSecurityPolicy
	PodDisruptionBudget ServiceAccount Secret SecretList ConfigMap StorageClass PersistentVolume
	PersistentVolumeClaim CustomResourceDefinition ClusterRole ClusterRoleList ClusterRoleBinding
	ClusterRoleBindingList Role RoleList RoleBinding RoleBindingList Service DaemonSet Pod
	ReplicationController ReplicaSet Deployment HorizontalPodAutoscaler StatefulSet Job CronJob
	IngressClass Ingress APIService`)

var kindRe = regexp.MustCompile(`(?m)^kind:\s*(\S+)`)

func rank(doc string) int {
	if m := kindRe.FindStringSubmatch(doc); m != nil {
		for i, k := range installOrder {
			if k == m[1] {
				return i
			}
		}
	}
	return len(installOrder)
}

// ordered splits the rendered stream into documents and sorts them
// stably by kind, as Helm does before applying.
func ordered(stream string) string {
	var docs []string
	for _, d := range strings.Split(stream, "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(d, "---\n")) != "" {
			docs = append(docs, strings.TrimPrefix(d, "---\n"))
		}
	}
	sort.SliceStable(docs, func(i, j int) bool { return rank(docs[i]) < rank(docs[j]) })
	var b strings.Builder
	for _, d := range docs {
		b.WriteString("---\n" + strings.TrimSuffix(d, "\n") + "\n")
	}
	return b.String()
}

func render(tpl *template.Template, name string, top map[string]interface{}, out *bytes.Buffer, manifest bool) error {
	data := map[string]interface{}{}
	for k, v := range top {
		data[k] = v
	}
	data["Template"] = map[string]interface{}{"Name": name, "BasePath": filepath.Dir(name)}
	var b bytes.Buffer
	if err := tpl.ExecuteTemplate(&b, name, data); err != nil {
		return err
	}
	text := strings.ReplaceAll(b.String(), "<no value>", "")
	if !manifest {
		out.WriteString(text)
		_, err := os.Stdout.Write(out.Bytes())
		return err
	}
	if strings.TrimSpace(text) == "" {
		return nil
	}
	fmt.Fprintf(out, "---\n# Source: %s\n%s\n", name, strings.Trim(text, "\n"))
	return nil
}

