package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Settings from the environment and a config file
//
// Every flag of every command can also be set by an environment variable,
// DLFS_ and the flag's name in capitals with - as _ (--ram-cache:
// DLFS_RAM_CACHE), and in a YAML config file named by --config or
// DLFS_CONFIG. A flag given on the command line wins, then the
// environment, then the file, then the default.
//
// The file's top-level keys are flag names, for every command that has
// the flag (mount and doctor share theirs); a key that names a command
// holds settings for that command alone:
//
//	ram-cache: 64GiB
//	ssd-cache: /var/cache/dlfs/imagenet
//	join: [node001:7946, node002:7946]
//	stats:
//	  interval: 5s
//
// A key that is no flag (of any command at the top, of its command in a
// section) is an error naming the file and line, as is a value the flag
// refuses. Environment variables that name no flag are left alone: other
// tools use the prefix too (the Python helper's DLFS_CONTROL_NAME is
// --control-name's, and means the same).

// envPrefix starts the environment variable of every flag.
const envPrefix = "DLFS_"

// notSettable are the flags that only the command line sets.
var notSettable = map[string]bool{"help": true, "version": true, "config": true}

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// configSetting is one key of the file, where it stands.
type configSetting struct {
	value string
	line  int
}

// configFile is a parsed config file: settings for every command ("")
// and per command.
type configFile struct {
	path     string
	settings map[string]map[string]configSetting // command ("" for all) -> flag -> setting
}

// loadConfig parses the YAML file at path, checking every key against
// the flags of root's commands.
func loadConfig(path string, root *cobra.Command) (*configFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return parseConfig(path, b, root)
}

func parseConfig(path string, b []byte, root *cobra.Command) (*configFile, error) {
	cf := &configFile{path: path, settings: map[string]map[string]configSetting{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return cf, nil // empty, or comments only
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want flag: value lines (a YAML mapping)", path, top.Line)
	}
	cmds := map[string]*cobra.Command{}
	flags := map[string]bool{} // of any command
	for _, c := range root.Commands() {
		cmds[c.Name()] = c
		c.Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
	}
	var walk func(section string, m *yaml.Node, known func(string) bool) error
	walk = func(section string, m *yaml.Node, known func(string) bool) error {
		set := map[string]configSetting{}
		cf.settings[section] = set
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := k.Value
			at := fmt.Sprintf("%s:%d", path, k.Line)
			if _, dup := set[key]; dup {
				return fmt.Errorf("%s: %s is set twice", at, key)
			}
			if c := cmds[key]; c != nil && section == "" && v.Kind == yaml.MappingNode {
				if _, dup := cf.settings[key]; dup {
					return fmt.Errorf("%s: the %s section comes twice", at, key)
				}
				if err := walk(key, v, func(name string) bool { return c.Flags().Lookup(name) != nil }); err != nil {
					return err
				}
				continue
			}
			switch {
			case notSettable[key]:
				return fmt.Errorf("%s: %s cannot be set in a config file", at, key)
			case !known(key) && section == "":
				return fmt.Errorf("%s: unknown key %q: not a flag of any dlfs command (see dlfs COMMAND --help)", at, key)
			case !known(key):
				return fmt.Errorf("%s: unknown key %q: not a flag of dlfs %s (see dlfs %s --help)", at, key, section, section)
			}
			val, err := scalarValue(v)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", at, key, err)
			}
			set[key] = configSetting{value: val, line: k.Line}
		}
		return nil
	}
	return cf, walk("", top, func(name string) bool { return flags[name] })
}

// scalarValue is a flag's value as the command line would give it: a
// list (for flags such as --join) becomes a comma list.
func scalarValue(v *yaml.Node) (string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", errors.New("no value (write \"\" for an empty one)")
		}
		return v.Value, nil
	case yaml.SequenceNode:
		var items []string
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode {
				return "", errors.New("want a list of plain values")
			}
			items = append(items, it.Value)
		}
		return strings.Join(items, ","), nil
	}
	return "", errors.New("want a value or a list of values")
}

// applySettings sets each flag of cmd that the command line left unset
// from the environment (lookupEnv), else from the config file cf (nil:
// none): cmd's section first, then the top level.
func applySettings(cmd *cobra.Command, cf *configFile, lookupEnv func(string) (string, bool)) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || notSettable[f.Name] {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if err := cmd.Flags().Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
			return
		}
		if cf == nil {
			return
		}
		for _, section := range []string{cmd.Name(), ""} {
			if s, ok := cf.settings[section][f.Name]; ok {
				if err := cmd.Flags().Set(f.Name, s.value); err != nil {
					errs = append(errs, fmt.Errorf("%s:%d: %s %q: %w", cf.path, s.line, f.Name, s.value, err))
				}
				return
			}
		}
	})
	return errors.Join(errs...)
}

// addConfig gives root --config and makes every command take its unset
// flags from the environment and the config file before it runs.
func addConfig(root *cobra.Command, lookupEnv func(string) (string, bool)) {
	var path string
	root.PersistentFlags().StringVar(&path, "config", "", "a YAML file of settings: flag: value lines, for every command, and a section per command (env "+envPrefix+"CONFIG); the command line wins, then "+envPrefix+"* variables, then the file")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		p := path
		if p == "" {
			p, _ = lookupEnv(envPrefix + "CONFIG")
		}
		var cf *configFile
		if p != "" {
			var err error
			if cf, err = loadConfig(p, root); err != nil {
				return err
			}
		}
		return applySettings(cmd, cf, lookupEnv)
	}
}
