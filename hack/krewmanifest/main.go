// Command krewmanifest fills the krew manifest template
// plugins/shardkeeper.yaml for a release and checks the result against
// krew's rules for an index manifest.
//
//	go run ./hack/krewmanifest -template plugins/shardkeeper.yaml -version v0.1.0 -dist dist > dist/shardkeeper.yaml
//
// The template is in krew-release-bot's form: {{ .TagName }} is the tag,
// and {{ addURIAndSha URL .TagName }} becomes the archive's uri and
// sha256, the sum computed from the archive of that name in -dist (so the
// manifest is filled offline, before anything is uploaded).
//
// Validate holds krew's rules (sigs.k8s.io/krew internal/index/validation,
// v0.4.3) as a schema check: krew's package is internal and its module
// requires client-go v11, which this module cannot take beside v0.37.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

func main() {
	var tmpl, version, dist string
	var check string
	flag.StringVar(&tmpl, "template", "plugins/shardkeeper.yaml", "the krew manifest template")
	flag.StringVar(&version, "version", "", "the release tag, vX.Y.Z")
	flag.StringVar(&dist, "dist", "dist", "directory holding the plugin archives the template names")
	flag.StringVar(&check, "validate", "", "validate this filled manifest instead of filling the template")
	flag.Parse()
	if check != "" {
		b, err := os.ReadFile(check)
		if err == nil {
			err = Validate(b, "")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "krewmanifest:", err)
			os.Exit(1)
		}
		return
	}
	b, err := os.ReadFile(tmpl)
	if err == nil {
		b, err = Fill(b, version, dist)
	}
	if err == nil {
		err = Validate(b, version)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "krewmanifest:", err)
		os.Exit(1)
	}
	os.Stdout.Write(b)
}

// Fill renders the template for tag, with each archive's sum read from
// dist.
func Fill(tmpl []byte, tag, dist string) ([]byte, error) {
	if !semverTag.MatchString(tag) {
		return nil, fmt.Errorf("version %q: want a tag like v1.2.3", tag)
	}
	funcs := template.FuncMap{
		// As krew-release-bot's: the uri line, and the sha256 line at the
		// indentation of the template's platform entries.
		"addURIAndSha": func(url, _ string) (string, error) {
			// The URL is itself a template ({{ .TagName }}).
			u, err := execute("uri", url, tag, nil)
			if err != nil {
				return "", err
			}
			sum, err := fileSHA256(filepath.Join(dist, path.Base(u)))
			if err != nil {
				return "", fmt.Errorf("archive for %s: %w", u, err)
			}
			return fmt.Sprintf("uri: %s\n    sha256: %s", u, sum), nil
		},
	}
	// The template's opening comment describes the template; the filled
	// manifest says what it is instead.
	body := string(tmpl)
	for strings.HasPrefix(body, "#") {
		_, body, _ = strings.Cut(body, "\n")
	}
	out, err := execute("manifest", body, tag, funcs)
	if err != nil {
		return nil, err
	}
	return []byte("# krew manifest of kubectl-shardkeeper " + tag + ", filled by `make release` from plugins/shardkeeper.yaml.\n" + out), nil
}

func execute(name, text, tag string, funcs template.FuncMap) (string, error) {
	t, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, map[string]string{"TagName": tag}); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Plugin is the part of krew's index.Plugin (apiVersion
// krew.googlecontainertools.github.com/v1alpha2) that Validate reads.
type Plugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string     `json:"version"`
		ShortDescription string     `json:"shortDescription"`
		Description      string     `json:"description"`
		Homepage         string     `json:"homepage"`
		Platforms        []Platform `json:"platforms"`
	} `json:"spec"`
}

// Platform is krew's index.Platform.
type Platform struct {
	URI      string `json:"uri"`
	Sha256   string `json:"sha256"`
	Bin      string `json:"bin"`
	Selector *struct {
		MatchLabels      map[string]string `json:"matchLabels"`
		MatchExpressions []any             `json:"matchExpressions"`
	} `json:"selector"`
	Files []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"files"`
}

var (
	// krew's plugin name rule (validation.IsSafePluginName plus its
	// lower-case, dash-separated form).
	pluginName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	// krew requires the version to parse as semver with a leading v.
	semverTag = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	sha256Hex = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// Validate applies krew's manifest rules (ValidatePlugin, validatePlatform
// and validateSelector): apiVersion and kind, a safe name, a semver
// version, a short description, at least one platform, each with a
// selector, an https uri, a sha256 of 64 lower-case hex digits and a bin
// that is a relative path staying inside the plugin; and no two platforms
// with the same selector. With tag set, the version must be that tag.
func Validate(manifest []byte, tag string) error {
	var p Plugin
	if err := yaml.UnmarshalStrict(manifest, &p); err != nil {
		return fmt.Errorf("parse the manifest: %w", err)
	}
	var errs []string
	fail := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" {
		fail("apiVersion %q: want krew.googlecontainertools.github.com/v1alpha2", p.APIVersion)
	}
	if p.Kind != "Plugin" {
		fail("kind %q: want Plugin", p.Kind)
	}
	if !pluginName.MatchString(p.Metadata.Name) {
		fail("metadata.name %q: want lower-case letters, digits and dashes", p.Metadata.Name)
	}
	if !semverTag.MatchString(p.Spec.Version) {
		fail("spec.version %q: want a semantic version with a leading v", p.Spec.Version)
	}
	if tag != "" && p.Spec.Version != tag {
		fail("spec.version %q: want the release's %q", p.Spec.Version, tag)
	}
	if p.Spec.ShortDescription == "" {
		fail("spec.shortDescription: empty")
	}
	if len(p.Spec.Platforms) == 0 {
		fail("spec.platforms: empty")
	}
	seen := map[string]int{}
	for i, pl := range p.Spec.Platforms {
		at := fmt.Sprintf("spec.platforms[%d]", i)
		if pl.Selector == nil || len(pl.Selector.MatchLabels)+len(pl.Selector.MatchExpressions) == 0 {
			fail("%s.selector: empty", at)
		} else {
			k := fmt.Sprint(pl.Selector.MatchLabels, pl.Selector.MatchExpressions)
			if j, dup := seen[k]; dup {
				fail("%s.selector: the same as spec.platforms[%d]'s", at, j)
			}
			seen[k] = i
		}
		if !strings.HasPrefix(pl.URI, "https://") {
			fail("%s.uri %q: want an https URL", at, pl.URI)
		}
		if !sha256Hex.MatchString(pl.Sha256) {
			fail("%s.sha256 %q: want 64 lower-case hex digits", at, pl.Sha256)
		}
		if pl.Bin == "" || path.IsAbs(pl.Bin) || strings.HasPrefix(path.Clean(pl.Bin), "..") {
			fail("%s.bin %q: want a relative path inside the plugin", at, pl.Bin)
		}
		for j, f := range pl.Files {
			if f.From == "" || f.To == "" {
				fail("%s.files[%d]: from and to are both needed", at, j)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("krew manifest: %s", strings.Join(errs, "; "))
	}
	return nil
}
