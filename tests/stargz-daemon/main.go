// stargz-daemon serves the stargz snapshotter to containerd as a proxy snapshotter, for
// tests/lazy_pull.rs. Debian packages the snapshotter's library
// (golang-github-containerd-stargz-snapshotter-dev) but not its daemon,
// containerd-stargz-grpc; this is that daemon's core, with the snapshotter's defaults: the
// service's own configuration, plain HTTP to a registry on 127.0.0.1, memory metadata, no
// keychain (the test's registry asks for no login). Debug logs go to standard error: the
// snapshotter says there whether it prepared each layer as a remote snapshot.
//
// usage: stargz-daemon -address SOCKET -root DIR [-config FILE] [-no-background-fetch]
//
//	[-cpuprofile FILE]
//
// -config reads the upstream daemon's config.toml (its service section: prefetch, background
// fetch, [blob], [directory_cache], [fuse]), so a benchmark can state the snapshotter's
// settings as a node would write them. -cpuprofile writes where the daemon spent its CPU, from
// start to a stop by signal, for `go tool pprof`.
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/BurntSushi/toml"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

func main() {
	address := flag.String("address", "", "the unix socket to serve on")
	root := flag.String("root", "", "the snapshotter's root directory")
	configFile := flag.String("config", "", "the snapshotter's config.toml")
	noBackground := flag.Bool("no-background-fetch", false, "fetch chunks only when read")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile here when stopped")
	flag.Parse()
	if *address == "" || *root == "" {
		flag.Usage()
		os.Exit(2)
	}
	if *cpuProfile != "" {
		out, err := os.Create(*cpuProfile)
		if err != nil {
			logrus.WithError(err).Fatal("cannot create the CPU profile")
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			logrus.WithError(err).Fatal("cannot start the CPU profile")
		}
		defer func() {
			pprof.StopCPUProfile()
			out.Close()
		}()
	}
	logrus.SetLevel(logrus.DebugLevel)
	logrus.SetFormatter(&logrus.JSONFormatter{})
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logrus.StandardLogger()))

	config := &service.Config{}
	if *configFile != "" {
		meta, err := toml.DecodeFile(*configFile, config)
		if err != nil {
			log.G(ctx).WithError(err).Fatalf("cannot read %s", *configFile)
		}
		// A misspelt key would leave a default in place unnoticed.
		if unknown := meta.Undecoded(); len(unknown) > 0 {
			log.G(ctx).Fatalf("%s: unknown keys %v", *configFile, unknown)
		}
	}
	if *noBackground {
		config.Config.NoBackgroundFetch = true
	}
	snapshotter, err := service.NewStargzSnapshotterService(ctx, *root, config)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("cannot start the snapshotter")
	}
	server := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(server, snapshotservice.FromSnapshotter(snapshotter))
	if err := os.MkdirAll(filepath.Dir(*address), 0o700); err != nil {
		log.G(ctx).WithError(err).Fatal("cannot make the socket's directory")
	}
	_ = os.Remove(*address)
	listener, err := net.Listen("unix", *address)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("cannot listen")
	}
	go func() {
		if err := server.Serve(listener); err != nil {
			log.G(ctx).WithError(err).Fatal("serving stopped")
		}
	}()
	log.G(ctx).Info("serving")

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	server.Stop()
	// Closing unmounts every layer the snapshotter mounted.
	if err := snapshotter.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("closing the snapshotter")
	}
}
