// Command xdsdump prints the xDS resources istiod generates for a golden case
// of meshpilot's (tests/golden/cases/<case>): the same config.yaml, mesh.yaml
// and proxies (the test passes them with the metadata Istio's agent sends),
// served by Istio's own discovery server in-process (the fake
// server Istio's pilot tests use), asked over ADS the way a sidecar asks: CDS
// and LDS by wildcard, then RDS for the route names the listeners name and EDS
// for the EDS clusters. Output is one JSON object on stdout:
//
//	{"<proxy>": {"clusters": [...], "listeners": [...], "routes": [...], "endpoints": [...]}}
//
// with each resource in protobuf JSON under proto field names, so that
// tests/reference compares it with meshpilot's output field by field.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	kubeyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"istio.io/istio/pilot/pkg/config/kube/crd"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/test"
)

// domain is the DNS domain of the fake cluster, as the fake server's registries use it.
const domain = "cluster.local"

type proxySpec struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata"`
	// Listeners, when set, makes this a proxyless gRPC client: it asks for
	// these listeners by name, then for what they name, as gRPC's xDS client does.
	Listeners []string `json:"listeners"`
}

func main() {
	caseDir := flag.String("case", "", "a golden case directory (config.yaml, proxies.yaml, optional mesh.yaml)")
	proxiesFile := flag.String("proxies", "", "the proxies to ask for, as YAML or JSON (default: the case's proxies.yaml)")
	serverAddr := flag.String("server", "", "ask this plaintext ADS server (host:port) instead of istiod in-process")
	flag.Parse()
	if *caseDir == "" && (*serverAddr == "" || *proxiesFile == "") {
		fmt.Fprintln(os.Stderr, "usage: xdsdump --case DIR [--proxies FILE] | xdsdump --server HOST:PORT --proxies FILE")
		os.Exit(2)
	}
	if *proxiesFile == "" {
		*proxiesFile = filepath.Join(*caseDir, "proxies.yaml")
	}
	// Istio's packages log to stdout, which carries the JSON: send their
	// log to stderr, errors only.
	logOptions := log.DefaultOptions()
	logOptions.OutputPaths = []string{"stderr"}
	logOptions.SetDefaultOutputLevel(log.OverrideScopeName, log.ErrorLevel)
	if err := log.Configure(logOptions); err != nil {
		fmt.Fprintln(os.Stderr, "xdsdump:", err)
		os.Exit(1)
	}
	proxies, err := readProxies(*proxiesFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsdump:", err)
		os.Exit(1)
	}
	var out []byte
	if *serverAddr != "" {
		// Another server (meshpilot) asked by the very same client, so both
		// sides of a comparison are asked for the same things in the same order.
		out, err = dumpAll(proxies, func(context.Context, string) (net.Conn, error) {
			return (&net.Dialer{}).Dial("tcp", *serverAddr)
		})
	} else {
		out, err = dumpCase(*caseDir, proxies)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsdump:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}

func readProxies(path string) (map[string]proxySpec, error) {
	proxies := map[string]proxySpec{}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal(raw, &proxies); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return proxies, nil
}

type dialer func(context.Context, string) (net.Conn, error)

// dumpAll asks the server behind dial for every proxy's resources.
func dumpAll(proxies map[string]proxySpec, dial dialer) ([]byte, error) {
	result := map[string]map[string][]json.RawMessage{}
	for name, spec := range proxies {
		got, err := dumpProxy(dial, spec)
		if err != nil {
			return nil, fmt.Errorf("proxy %s: %v", name, err)
		}
		result[name] = got
	}
	return json.MarshalIndent(result, "", " ")
}

func dumpCase(dir string, proxies map[string]proxySpec) ([]byte, error) {
	istioConfig, kubeObjects, err := splitConfig(filepath.Join(dir, "config.yaml"))
	if err != nil {
		return nil, err
	}
	configs, _, err := crd.ParseInputs(istioConfig)
	if err != nil {
		return nil, fmt.Errorf("config.yaml: %v", err)
	}
	for i := range configs {
		// istiod's config sources stamp every object with the cluster's DNS
		// domain, which resolves short hosts ("reviews" in namespace default
		// is reviews.default.svc.cluster.local); the test helpers' own parser
		// leaves it empty, so short hosts would match nothing.
		configs[i].Domain = domain
		if configs[i].Namespace == "" {
			configs[i].Namespace = "default"
		}
	}
	opts := xds.FakeOptions{Configs: configs, KubernetesObjectString: kubeObjects}
	if meshYAML, err := os.ReadFile(filepath.Join(dir, "mesh.yaml")); err == nil {
		m, err := mesh.ApplyMeshConfigDefaults(string(meshYAML))
		if err != nil {
			return nil, fmt.Errorf("mesh.yaml: %v", err)
		}
		opts.MeshConfig = m
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	var out []byte
	var failure error
	werr := test.Wrap(func(t test.Failer) {
		server := xds.NewFakeDiscoveryServer(t, opts)
		out, failure = dumpAll(proxies, func(context.Context, string) (net.Conn, error) {
			return server.BufListener.Dial()
		})
	})
	if werr != nil {
		return nil, werr
	}
	return out, failure
}

// splitConfig separates Istio's objects (for the config store) from Kubernetes'
// (for the fake API server), as the two go to different places in istiod.
func splitConfig(path string) (string, string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	var istio, kube []string
	decoder := kubeyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj map[string]any
		if err := decoder.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return "", "", fmt.Errorf("%s: %v", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		text, err := yaml.Marshal(obj)
		if err != nil {
			return "", "", err
		}
		apiVersion, _ := obj["apiVersion"].(string)
		group, _, _ := strings.Cut(apiVersion, "/")
		if strings.HasSuffix(group, "istio.io") {
			istio = append(istio, string(text))
		} else {
			kube = append(kube, string(text))
		}
	}
	return strings.Join(istio, "\n---\n"), strings.Join(kube, "\n---\n"), nil
}

// stream is one ADS connection as a sidecar holds it: requests carry the
// node on the first message only and every response is ACKed.
type stream struct {
	client  discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node    *core.Node
	first   bool
	watched map[string][]string
}

func (s *stream) fetch(typeURL string, names []string) ([]*anypb.Any, error) {
	req := &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
	if s.first {
		req.Node = s.node
		s.first = false
	}
	if err := s.client.Send(req); err != nil {
		return nil, err
	}
	// A server may push another type it was asked for earlier before it
	// answers this one: ACK that and wait on (the stream's deadline bounds it).
	for {
		resp, err := s.client.Recv()
		if err != nil {
			return nil, err
		}
		ack := &discovery.DiscoveryRequest{
			TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce,
			ResourceNames: s.watched[resp.TypeUrl],
		}
		if resp.TypeUrl == typeURL {
			ack.ResourceNames = names
			s.watched[typeURL] = names
			return resp.Resources, s.client.Send(ack)
		}
		if err := s.client.Send(ack); err != nil {
			return nil, err
		}
	}
}

func dumpProxy(dial dialer, spec proxySpec) (map[string][]json.RawMessage, error) {
	metadata, err := structpb.NewStruct(spec.Metadata)
	if err != nil {
		return nil, fmt.Errorf("metadata: %v", err)
	}
	conn, err := grpc.NewClient("passthrough:///xds",
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	s := &stream{client: client, node: &core.Node{Id: spec.ID, Metadata: metadata}, first: true, watched: map[string][]string{}}

	var clusters, listeners, routes []*anypb.Any
	if spec.Listeners != nil {
		if len(spec.Listeners) == 0 {
			return nil, fmt.Errorf("listeners: an empty list asks for nothing")
		}
		if listeners, err = s.fetch(v3.ListenerType, spec.Listeners); err != nil {
			return nil, fmt.Errorf("LDS: %v", err)
		}
		if routes, err = s.fetchRoutes(listeners); err != nil {
			return nil, err
		}
		names, err := routeClusterNames(routes)
		if err != nil {
			return nil, err
		}
		if len(names) > 0 {
			if clusters, err = s.fetch(v3.ClusterType, names); err != nil {
				return nil, fmt.Errorf("CDS: %v", err)
			}
		}
	} else {
		if clusters, err = s.fetch(v3.ClusterType, nil); err != nil {
			return nil, fmt.Errorf("CDS: %v", err)
		}
		if listeners, err = s.fetch(v3.ListenerType, nil); err != nil {
			return nil, fmt.Errorf("LDS: %v", err)
		}
		if routes, err = s.fetchRoutes(listeners); err != nil {
			return nil, err
		}
	}
	edsNames, err := edsClusterNames(clusters)
	if err != nil {
		return nil, err
	}
	var endpoints []*anypb.Any
	if len(edsNames) > 0 {
		if endpoints, err = s.fetch(v3.EndpointType, edsNames); err != nil {
			return nil, fmt.Errorf("EDS: %v", err)
		}
	}
	out := map[string][]json.RawMessage{}
	for key, resources := range map[string][]*anypb.Any{
		"clusters": clusters, "listeners": listeners, "routes": routes, "endpoints": endpoints,
	} {
		encoded := []json.RawMessage{}
		for _, r := range resources {
			text, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", r.TypeUrl, err)
			}
			encoded = append(encoded, text)
		}
		out[key] = encoded
	}
	return out, nil
}

// fetchRoutes asks for the route configurations the listeners name, if any.
func (s *stream) fetchRoutes(listeners []*anypb.Any) ([]*anypb.Any, error) {
	names, err := routeConfigNames(listeners)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	routes, err := s.fetch(v3.RouteType, names)
	if err != nil {
		return nil, fmt.Errorf("RDS: %v", err)
	}
	return routes, nil
}

// routeClusterNames lists the clusters the routes send to, which a gRPC
// client asks for next.
func routeClusterNames(resources []*anypb.Any) ([]string, error) {
	seen := map[string]bool{}
	for _, r := range resources {
		rc := &route.RouteConfiguration{}
		if err := r.UnmarshalTo(rc); err != nil {
			return nil, err
		}
		for _, vh := range rc.VirtualHosts {
			for _, rt := range vh.Routes {
				action := rt.GetRoute()
				if name := action.GetCluster(); name != "" {
					seen[name] = true
				}
				for _, wc := range action.GetWeightedClusters().GetClusters() {
					seen[wc.Name] = true
				}
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

func edsClusterNames(resources []*anypb.Any) ([]string, error) {
	var names []string
	for _, r := range resources {
		c := &cluster.Cluster{}
		if err := r.UnmarshalTo(c); err != nil {
			return nil, err
		}
		if c.GetType() == cluster.Cluster_EDS {
			names = append(names, c.Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// routeConfigNames walks every filter chain's HTTP connection manager for the
// RDS names, as Envoy does when it asks for routes.
func routeConfigNames(resources []*anypb.Any) ([]string, error) {
	seen := map[string]bool{}
	for _, r := range resources {
		l := &listener.Listener{}
		if err := r.UnmarshalTo(l); err != nil {
			return nil, err
		}
		chains := append([]*listener.FilterChain{}, l.FilterChains...)
		if l.DefaultFilterChain != nil {
			chains = append(chains, l.DefaultFilterChain)
		}
		for _, chain := range chains {
			for _, f := range chain.Filters {
				manager := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(manager) != nil {
					continue
				}
				if rds := manager.GetRds(); rds != nil {
					seen[rds.RouteConfigName] = true
				}
			}
		}
		if api := l.GetApiListener().GetApiListener(); api != nil {
			manager := &hcm.HttpConnectionManager{}
			if api.UnmarshalTo(manager) == nil && manager.GetRds() != nil {
				seen[manager.GetRds().RouteConfigName] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}
