// yamlstrict.go - reads every document of YAML files (or standard input,
// "-") with gopkg.in/yaml.v3, the decoder kustomize, Flux and Helm's Go
// tooling use, and fails on what it refuses: duplicate mapping keys above
// all (PyYAML and kubesim take the last value silently), tabs in
// indentation, malformed documents. One line per problem, naming the file;
// exit 1 when there is any.
//
//	yaml-strict FILE... | -
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

func check(name string, data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		var v interface{} // decoding into a value (not a Node) is where yaml.v3 refuses duplicate keys
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: document %d: %v", name, doc, err)
		}
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: yaml-strict FILE... | -")
		os.Exit(2)
	}
	bad := 0
	for _, name := range os.Args[1:] {
		var data []byte
		var err error
		if name == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(name)
		}
		if err == nil {
			err = check(name, data)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			bad++
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}
