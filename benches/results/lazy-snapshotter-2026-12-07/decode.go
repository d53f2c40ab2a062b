package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

func main() {
	for _, p := range os.Args[1:] {
		f, _ := os.Open(p)
		var r io.Reader
		if strings.HasSuffix(p, ".zst") {
			d, err := zstd.NewReader(f)
			if err != nil {
				panic(err)
			}
			r = d
		} else {
			g, err := gzip.NewReader(f)
			if err != nil {
				panic(err)
			}
			r = g
		}
		t := time.Now()
		n, err := io.Copy(io.Discard, r)
		if err != nil {
			panic(err)
		}
		s := time.Since(t).Seconds()
		fmt.Printf("%s: %d bytes out in %.2f s: %.0f MB/s\n", p, n, s, float64(n)/s/1e6)
	}
}
