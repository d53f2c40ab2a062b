// stargz-daemon serves the stargz snapshotter to containerd as a proxy snapshotter, for
// tests/lazy_pull.rs. Debian packages the snapshotter's library
// (golang-github-containerd-stargz-snapshotter-dev) but not its daemon,
// containerd-stargz-grpc; this is that daemon's core, with the snapshotter's defaults: the
// service's own configuration, plain HTTP to a registry on 127.0.0.1, memory metadata, no
// keychain (the test's registry asks for no login). Debug logs go to standard error: the
// snapshotter says there whether it prepared each layer as a remote snapshot.
//
// usage: stargz-daemon -address SOCKET -root DIR [-no-background-fetch]
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

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
	noBackground := flag.Bool("no-background-fetch", false, "fetch chunks only when read")
	flag.Parse()
	if *address == "" || *root == "" {
		flag.Usage()
		os.Exit(2)
	}
	logrus.SetLevel(logrus.DebugLevel)
	logrus.SetFormatter(&logrus.JSONFormatter{})
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logrus.StandardLogger()))

	config := &service.Config{}
	config.Config.NoBackgroundFetch = *noBackground
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
