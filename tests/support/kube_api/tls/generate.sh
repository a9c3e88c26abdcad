#!/bin/sh
# Writes the test Kubernetes server's TLS files (KubeApi::serve_tls): a CA, and a certificate it
# signed for 127.0.0.1 and localhost, both valid for 100 years. Test material only: the keys are
# public, in this repository. Run from this directory; the tests read the files as they are.
set -eu
openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days 36500 -subj "/CN=envlens test kube-api CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem
openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out server.key
openssl req -new -key server.key -subj "/CN=127.0.0.1" -out server.csr
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 36500 \
  -extfile server.ext -out server.pem
rm -f server.csr server.ext ca.srl ca.key
