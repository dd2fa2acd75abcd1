// A js-libp2p peer for an Experience Ledger network: it joins the network's gossip topic, checks every operation
// it receives (DAG-CBOR, CID, Ed25519 signature of the did:key author) with JavaScript libraries only, and
// publishes operations it builds and signs itself. It shares no code with the Python node: it is a second,
// independent reading of docs/PROTOCOL.md (§1-§4, §10.1-§10.2).
//
//   node peer.mjs --network devnet --connect /ip4/127.0.0.1/tcp/PORT/p2p/PEERID [--connect ...]
//
// It writes one JSON object per line on stdout (events: ready, peers, batch, operation, published, ping, error,
// stopped) and reads commands the same way on stdin:
//   {"cmd": "publish", "contents": [{text, domain: [...], confidence, embedding: {model, dim, values: hex},
//                                    examples: [{input, output, correct}] (optional)}, ...], "tamper": false}
//       one gossip message holding one add per content; "tamper": true flips a bit of each signature after
//       signing (invalid operations, to see them refused)
//   {"cmd": "peers"}                      what it is connected to, over what, and who subscribes to the topic
//   {"cmd": "ping"}                       a libp2p ping (/ipfs/ping/1.0.0) round trip to every connected peer
//   {"cmd": "stop"}                       (end of input stops it too)
// See docs/INTEROP.md.

import { parseArgs } from 'node:util'
import { createInterface } from 'node:readline'
import { randomBytes } from 'node:crypto'
import { createLibp2p } from 'libp2p'
import { tcp } from '@libp2p/tcp'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { gossipsub } from '@chainsafe/libp2p-gossipsub'
import { TopicValidatorResult } from '@libp2p/interface'
import { multiaddr } from '@multiformats/multiaddr'
import * as dagCbor from '@ipld/dag-cbor'
import * as cborg from 'cborg'
import { CID } from 'multiformats/cid'
import { sha256 } from 'multiformats/hashes/sha2'
import { base58btc } from 'multiformats/bases/base58'
import { ed25519 } from '@noble/curves/ed25519'

const ED25519_PUB = [0xed, 0x01] // multicodec ed25519-pub, as a varint
const MAX_PARENTS = 64 // the network default (PROTOCOL.md §5)
const PUBLISH_PATIENCE_MS = 20000 // how long a publish waits for a subscribed peer

const { values: args } = parseArgs({
  options: {
    network: { type: 'string', default: 'devnet' },
    connect: { type: 'string', multiple: true, default: [] },
    listen: { type: 'string', default: '/ip4/127.0.0.1/tcp/0' },
    'author-seed': { type: 'string' }, // 64 hex digits; a fresh key when absent
    // for the message-id experiment of docs/INTEROP.md: js gossipsub's own id function, and a smaller mesh
    'msg-id': { type: 'string', default: 'spec' }, // spec | js-default
    'mesh-degree': { type: 'string' }
  }
})
if (!['spec', 'js-default'].includes(args['msg-id'])) throw new Error('--msg-id: spec or js-default')
const topic = `/expledger/${args.network}/ops/1` // PROTOCOL.md §10.2

function emit (event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n')
}

const equalBytes = (a, b) => a.length === b.length && a.every((byte, i) => byte === b[i])
const compareBytes = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))

// --- identity: did:key (PROTOCOL.md §3) -----------------------------------------------------------------------

function didFromPublicKey (publicKey) {
  return 'did:key:' + base58btc.encode(Uint8Array.from([...ED25519_PUB, ...publicKey]))
}

function publicKeyFromDid (did) {
  if (typeof did !== 'string' || !did.startsWith('did:key:z')) throw new Error('author: not a base58btc did:key')
  const raw = base58btc.decode(did.slice('did:key:'.length))
  if (raw.length !== 34 || raw[0] !== ED25519_PUB[0] || raw[1] !== ED25519_PUB[1]) {
    throw new Error('author: not an Ed25519 did:key')
  }
  return raw.subarray(2)
}

const authorSeed = args['author-seed'] ? Buffer.from(args['author-seed'], 'hex') : randomBytes(32)
const author = { seed: authorSeed, did: didFromPublicKey(ed25519.getPublicKey(authorSeed)) }

// --- operations: decode, encode, identify, verify (PROTOCOL.md §1-§4) ----------------------------------------

/** A number DAG-CBOR must write as a float64 even when integral: a JS number cannot tell 1.0 from 1, and
 * @ipld/dag-cbor writes every integral number as an integer (the trick of ../vectors/reference/generate.mjs). */
class Float64 {
  constructor (value) {
    this.value = value
  }
}

const opEncodeOptions = {
  ...dagCbor.encodeOptions,
  typeEncoders: {
    ...dagCbor.encodeOptions.typeEncoders,
    Object: (value, ...rest) => value instanceof Float64
      ? [new cborg.Token(cborg.Type.float, value.value)] // dag-cbor's float64: true makes it 9 bytes, 0xfb
      : dagCbor.encodeOptions.typeEncoders.Object(value, ...rest)
  }
}

/** The canonical bytes of an operation map (with or without `signature`), knowing its schema: `confidence` is
 * the one float field of an operation (PROTOCOL.md §4), so it is written as a float64 whatever its value. */
function encodeOperation (op) {
  if (op.content === undefined) return cborg.encode(op, opEncodeOptions)
  const content = { ...op.content, confidence: new Float64(op.content.confidence) }
  return cborg.encode({ ...op, content }, opEncodeOptions)
}

/** PROTOCOL.md §3's shortcut to the signed message: `signature` sorts last, so drop its 76-byte entry and count
 * one entry fewer in the map's one-byte header. Checked against the re-encoding below. */
function signedPart (bytes) {
  return Uint8Array.from([bytes[0] - 1, ...bytes.subarray(1, bytes.length - 76)])
}

async function cidOf (bytes) {
  return CID.create(1, dagCbor.code, await sha256.digest(bytes))
}

/** What this peer finds about one operation's bytes; `valid` when every check passed. */
async function examine (bytes) {
  const cid = await cidOf(bytes)
  const found = { cid: cid.toString(), bytes: bytes.length }
  let op
  try {
    op = dagCbor.decode(bytes)
  } catch (error) {
    return { ...found, valid: false, error: `dag-cbor: ${error.message}` }
  }
  // one value, one encoding: re-encoding what was decoded must give the same bytes back
  found.canonical = equalBytes(encodeOperation(op), bytes)
  found.kind = op.kind
  found.author = op.author
  found.clock = op.clock
  found.parents = (op.parents ?? []).map(String)
  if (op.version !== 1 || !(op.signature instanceof Uint8Array) || op.signature.length !== 64) {
    return { ...found, valid: false, error: 'schema: version 1 and a 64-byte signature expected' }
  }
  let publicKey
  try {
    publicKey = publicKeyFromDid(op.author)
  } catch (error) {
    return { ...found, valid: false, error: error.message }
  }
  // the signed message is the canonical encoding of the map without its `signature` entry
  const { signature, ...unsigned } = op
  const message = encodeOperation(unsigned)
  found.shortcut_agrees = equalBytes(signedPart(bytes), message)
  found.signature = ed25519.verify(signature, message, publicKey, { zip215: false }) ? 'valid' : 'invalid'
  // and the check is not vacuous: the same signature over a message one bit off must fail
  const altered = Uint8Array.from(message)
  altered[altered.length - 1] ^= 1
  found.altered_rejected = !ed25519.verify(signature, altered, publicKey, { zip215: false })
  found.valid = found.canonical && found.shortcut_agrees && found.signature === 'valid' && found.altered_rejected
  return found
}

/** A gossip message (PROTOCOL.md §10.2): the map {ops, node, size}, nothing else. */
function decodeBatch (data) {
  const batch = dagCbor.decode(data)
  const keys = Object.keys(batch ?? {}).sort()
  if (keys.join() !== 'node,ops,size') throw new Error(`expected a map of ops, node, size; got ${keys}`)
  if (!Array.isArray(batch.ops) || batch.ops.length < 1 || batch.ops.length > 1000) throw new Error('ops: 1 to 1000')
  if (!batch.ops.every((op) => op instanceof Uint8Array)) throw new Error('ops: byte strings expected')
  return batch
}

// --- operations this peer makes ------------------------------------------------------------------------------

const heads = new Map() // CID string -> {cid, clock}: received operations no received operation names as parent

function remember (found, cid) {
  for (const parent of found.parents) heads.delete(parent)
  heads.set(found.cid, { cid, clock: found.clock })
}

/** An add of `content`, signed by this peer's author key; its parents are the heads of what it received. */
async function buildAdd ({ text, domain, confidence, embedding, examples = [] }, tamper) {
  const parents = [...heads.values()]
    .sort((a, b) => compareBytes(a.cid.bytes, b.cid.bytes))
    .slice(0, MAX_PARENTS)
  const unsigned = {
    version: 1,
    kind: 'add',
    author: author.did,
    clock: 1 + Math.max(0, ...parents.map((head) => head.clock)),
    parents: parents.map((head) => head.cid),
    created: Math.floor(Date.now() / 1000),
    content: {
      text,
      domain,
      confidence,
      examples,
      embedding: {
        model: embedding.model,
        dim: embedding.dim,
        values: Uint8Array.from(Buffer.from(embedding.values, 'hex'))
      },
      source: 'js-libp2p interop peer'
    }
  }
  const signature = ed25519.sign(encodeOperation(unsigned), author.seed)
  if (tamper) signature[0] ^= 1
  const bytes = encodeOperation({ ...unsigned, signature })
  return { bytes, cid: await cidOf(bytes), clock: unsigned.clock, parents: unsigned.parents.map(String) }
}

// --- the libp2p node -----------------------------------------------------------------------------------------

/** The spec's default message id, from ‖ seqno (libp2p specs, pubsub/README.md "Message Identification"), which
 * py-libp2p and go-libp2p use; js gossipsub's own default is the *protobuf public key* ‖ seqno instead. */
function specMessageId (msg) {
  const from = msg.from.toMultihash().bytes
  const seqno = Buffer.alloc(8)
  seqno.writeBigUInt64BE(msg.sequenceNumber)
  return Uint8Array.from([...from, ...seqno])
}

/** Mesh parameters for a mesh of `D` peers (gossipsub requires Dlo <= D <= Dhi and Dout < Dlo). */
function meshDegree (D) {
  return { D, Dlo: D, Dhi: D, Dout: 0, Dscore: 0 }
}

const node = await createLibp2p({
  addresses: { listen: [args.listen] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    ping: ping(),
    pubsub: gossipsub({
      globalSignaturePolicy: 'StrictSign',
      ...(args['msg-id'] === 'spec' ? { msgIdFn: specMessageId } : {}),
      ...(args['mesh-degree'] ? meshDegree(Number(args['mesh-degree'])) : {}),
      fallbackToFloodsub: false,
      allowPublishToZeroTopicPeers: false,
      emitSelf: false
    })
  }
})
const pubsub = node.services.pubsub

// check every message before it is delivered or forwarded, as a node of the network does (PROTOCOL.md §10.2)
pubsub.topicValidators.set(topic, async (forwarder, msg) => {
  let batch
  try {
    batch = decodeBatch(msg.data)
  } catch (error) {
    emit('error', { where: 'gossip', from: msg.from?.toString(), error: error.message })
    return TopicValidatorResult.Reject
  }
  const found = []
  for (const bytes of batch.ops) {
    const failed = async (error) => ({ cid: (await cidOf(bytes)).toString(), valid: false, error: error.message })
    found.push(await examine(bytes).catch(failed)) // e.g. a `content` that is not a map
  }
  const verdict = found.every((op) => op.valid) ? TopicValidatorResult.Accept : TopicValidatorResult.Reject
  emit('batch', {
    origin: msg.from.toString(),
    forwarder: forwarder.toString(),
    seqno: msg.sequenceNumber.toString(16).padStart(16, '0'),
    bytes: msg.data.length,
    node: batch.node,
    size: batch.size,
    operations: found.length,
    accepted: verdict === TopicValidatorResult.Accept
  })
  for (const op of found) {
    emit('operation', op)
    if (op.valid) remember(op, CID.parse(op.cid))
  }
  return verdict
})

async function reportPeers () {
  const connections = []
  for (const connection of node.getConnections()) {
    const known = await node.peerStore.get(connection.remotePeer).catch(() => ({ protocols: [] }))
    connections.push({
      peer: connection.remotePeer.toString(),
      encryption: connection.encryption,
      multiplexer: connection.multiplexer,
      streams: connection.streams.map((stream) => stream.protocol),
      protocols: known.protocols, // what the peer announced through identify
      score: pubsub.getScore(connection.remotePeer.toString()) // gossipsub v1.1 peer score, as this peer keeps it
    })
  }
  emit('peers', {
    connections,
    subscribers: pubsub.getSubscribers(topic).map(String),
    mesh: pubsub.getMeshPeers(topic).map(String)
  })
}

async function pingPeers () {
  for (const peer of node.getPeers()) {
    try {
      emit('ping', { peer: peer.toString(), ms: await node.services.ping.ping(peer) })
    } catch (error) {
      emit('error', { where: 'ping', peer: peer.toString(), error: error.message })
    }
  }
}
pubsub.addEventListener('subscription-change', reportPeers)
pubsub.addEventListener('gossipsub:graft', reportPeers)
pubsub.addEventListener('gossipsub:prune', reportPeers)
node.addEventListener('peer:disconnect', reportPeers)
node.addEventListener('peer:identify', reportPeers)

await node.start()
pubsub.subscribe(topic)
emit('ready', { peer_id: node.peerId.toString(), addrs: node.getMultiaddrs().map(String), did: author.did, topic })

for (const address of args.connect) {
  try {
    await node.dial(multiaddr(address))
  } catch (error) {
    emit('error', { where: 'dial', address, error: error.message })
  }
}

async function publish ({ contents, tamper = false }) {
  const ops = []
  for (const content of contents) ops.push(await buildAdd(content, tamper))
  const message = dagCbor.encode({ ops: ops.map((op) => op.bytes), node: author.did, size: 0 })
  const deadline = Date.now() + PUBLISH_PATIENCE_MS
  for (;;) {
    try {
      const { recipients } = await pubsub.publish(topic, message)
      emit('published', {
        cids: ops.map((op) => op.cid.toString()),
        clock: ops[0].clock,
        parents: ops[0].parents,
        bytes: message.length,
        recipients: recipients.map(String),
        tampered: tamper
      })
      return
    } catch (error) {
      if (Date.now() > deadline) throw error
      await new Promise((resolve) => setTimeout(resolve, 100)) // no subscribed peer yet
    }
  }
}

let stopping = false
async function stop () {
  if (stopping) return
  stopping = true
  await node.stop()
  emit('stopped')
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue
  try {
    const command = JSON.parse(line)
    if (command.cmd === 'publish') await publish(command)
    else if (command.cmd === 'peers') await reportPeers()
    else if (command.cmd === 'ping') await pingPeers()
    else if (command.cmd === 'stop') break
    else throw new Error(`unknown command ${JSON.stringify(command.cmd)}`)
  } catch (error) {
    emit('error', { where: 'command', error: error.message })
  }
}
await stop()
