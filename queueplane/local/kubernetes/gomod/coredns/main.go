// Package main is CoreDNS with a trimmed plugin list (CoreDNS's "external main" pattern): the
// stock binary links every plugin, cloud DNS providers included, for nothing a local cluster uses.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// Directive order is the order plugins see a query; it follows upstream's plugin.cfg.
var directives = []string{"bind", "ready", "health", "errors", "loadbalance", "cache", "hosts", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
