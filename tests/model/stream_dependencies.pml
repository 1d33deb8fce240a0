/*
 * The cross-stream dependency protocol of the MPS stream pool, checked
 * exhaustively: fork-overlay/aten/src/ATen/mps/MPSStreamDependencies.cpp
 * (DependencyTracker), MPSCommandBufferLifecycle.h (passes, marks, commits),
 * a stream's serial section with its deferred flush (MPSStream::runSerialized
 * and flushAsync; SimStream in the harness), and Metal's queues (one GPU per
 * queue running committed command buffers in order, an in-flight limit that
 * blocks command-buffer creation, shared events).
 * See Note [MPS cross-stream dependencies].
 *
 * Scope: NS streams (2 or 3), NB buffers, CAP command buffers per queue
 * (open ones included, as Metal counts them), the op scripts of the chosen
 * SCENARIO. Each stream's thread runs its script; the GPUs and the deferred
 * flushes run concurrently with everything.
 *
 * Checked:
 *   - no invalid end state: every thread finishes and every GPU drains;
 *   - safety (assert in gpu_exec): when a kernel's use of a buffer runs on
 *     the GPU, every conflicting use recorded before it (write/any or
 *     any/write, any stream) has already run -- which also covers a buffer
 *     handed to another stream for reuse, a write with no read before it.
 *
 * NO_REVALIDATE drops the re-check of a cycle found by the walk (which
 * reads one stream at a time); SPIN then finds an op told "no order exists"
 * in a scenario that has one.
 *
 * NO_RAW and NO_WAR drop the wait of a use for the last write on another
 * stream, and of a write for other streams' reads; the safety assertion
 * then fails in the ring scenario (which shows that it can).
 *
 * NO_REBIND records a kernel that binds a buffer its pass already wrote as
 * a new use (a read or a write); SPIN then finds the rebind scenario told
 * "no order exists".
 *
 * OLD_RULE puts back the protocol before the fix: the fast path stores its
 * mark and re-checks ownership afterwards (a failed re-check records again at
 * the same mark), GPU waits are encoded for uncommitted marks, and only
 * kInPass waiters take part in cycle detection.
 *
 * Abstractions: marks are small integers (scripts are short); a kernel's
 * uses run in one GPU step each; completion handlers only count completions
 * (their timeline bookkeeping is the lifecycle's and is tested by its unit
 * tests); a stream's serial section is a plain lock held by the stream's own
 * thread or its deferred flush (dispatch_async block); host uses (kHost) are
 * not used by the glue and are not modelled; event-wait timeouts are not
 * modelled (a wait that can never be satisfied is a hang).
 */

#ifndef NS
#define NS 2
#endif
#ifndef SCENARIO
#define SCENARIO 1
#endif
#ifndef CYCLE_OPS
#define CYCLE_OPS 2 /* ops per stream in scenario 1: 2 or 3 */
#endif
#define NB NS
#ifndef CAP
#define CAP 2
#endif
#define MAXREC 8
#define QLEN 24
#define NONE_B 255

#define READ 0
#define WRITE 1

#define SYNC_NONE 0
#define SYNC_COMMIT 1

mtype = { WAIT, SIGNAL, KERNEL, END };

/* ---- MPSCommandBufferLifecycle, per stream ---- */
byte open_mark[NS];      /* open_mark_ */
bool pass_work[NS];      /* pass_has_work_ */
bool has_buf[NS];        /* has_buffer_ */
bool dirty[NS];          /* dirty_ */
byte committed_mark[NS]; /* committed_mark_ */
byte commits[NS];        /* commit points committed_ */
byte completions[NS];    /* commit points completed */
/* ---- Metal ---- */
byte ev[NS];             /* the stream's timeline MTLSharedEvent */
byte inflight[NS];       /* uncompleted command buffers, open one included */
chan openbuf[NS] = [QLEN] of { mtype, byte, byte };
chan gpuq[NS] = [QLEN] of { mtype, byte, byte };
/* ---- MPSStream serial section and flushAsync ---- */
byte serial[NS];         /* holder's pid + 1, 0 when free */
byte flush_req[NS];      /* highest mark asked for; 0 none */
bool flush_any[NS];      /* OLD_RULE: a plain commit was asked for */
/* ---- DependencyTracker / BufferUses ---- */
byte word_owner[NB];     /* sole_: stream + 1, 0 when shared */
bool word_wrote[NB];
byte word_mark[NB];
bool buf_lock[NB];       /* BufferUses::mu_ */
bool has_write[NB];      /* last_write_ != 0 */
byte lw_s[NB];
byte lw_m[NB];
byte reads[NB * NS];     /* reads_[stream] */
byte wrote_at[NB * NS];  /* wrote_at_[stream] */
byte waiting_s[NS];      /* waiting_on_: (stream, mark), mark 0: none */
byte waiting_m[NS];
/* ---- safety bookkeeping (not part of the protocol) ---- */
byte nrec[NB];
byte rec_state[NB * MAXREC]; /* 1 recorded, 2 void, 3 ran on the GPU */
bool rec_write[NB * MAXREC];
byte lastslot[NB * NS];  /* the record slot of a stream's last new use */
byte raised;             /* ops that raised the cycle error */
byte finished;

/* ===== Metal: one GPU per queue ===== */

inline gpu_exec(b, slot) {
  /* the kernel's use of buffer b (record slot `slot`) runs */
  d_step {
    j = 0;
    do
    :: j < slot ->
       assert(!(rec_state[b * MAXREC + j] == 1 &&
                (rec_write[b * MAXREC + j] || rec_write[b * MAXREC + slot])));
       j++
    :: else -> break
    od;
    /* and none recorded after it ran first: a rebinding runs the slot of
       its pass's first use again */
    j = slot + 1;
    do
    :: j < nrec[b] ->
       assert(!(rec_state[b * MAXREC + j] == 3 &&
                (rec_write[b * MAXREC + j] || rec_write[b * MAXREC + slot])));
       j++
    :: else -> break
    od;
    rec_state[b * MAXREC + slot] = 3;
    j = 0
  }
}

proctype gpu(byte s) {
  mtype k;
  byte a, c, j;
end:
  do
  :: gpuq[s]?k, a, c ->
     if
     :: k == WAIT -> (ev[a] >= c)                    /* encodeWaitForEvent */
     :: k == SIGNAL -> d_step { if :: ev[s] < a -> ev[s] = a :: else skip fi }
     :: k == KERNEL -> gpu_exec(a, c)
     :: k == END -> d_step { inflight[s]--; completions[s]++ } /* completed */
     fi
  od
}

/* ===== MPSCommandBufferLifecycle ===== */

inline open_buffer(s) {
  /* Lifecycle::openBuffer -> [MPSCommandBuffer commandBufferFromCommandQueue:],
     which blocks while the queue has CAP uncompleted command buffers */
  if
  :: !has_buf[s] -> atomic { inflight[s] < CAP -> inflight[s]++; has_buf[s] = 1 }
  :: else -> skip
  fi
}

inline end_encoder(s) {
  /* Lifecycle::endEncoder: a pass that carried work signals its mark */
  d_step {
    if
    :: pass_work[s] -> openbuf[s]!SIGNAL, open_mark[s], 0;
                       open_mark[s]++; pass_work[s] = 0
    :: else -> skip
    fi
  }
}

inline commit_open(s) {
  /* Lifecycle::commitOpen: commit the open buffer if it has work; the
     committed mark is published after the commit */
  if
  :: has_buf[s] && dirty[s] ->
     d_step {
       do
       :: openbuf[s]?k, a, c -> gpuq[s]!k, a, c
       :: empty(openbuf[s]) -> break
       od;
       gpuq[s]!END, 0, 0;
       has_buf[s] = 0; dirty[s] = 0; commits[s]++;
       k = END; a = 0; c = 0
     };
     committed_mark[s] = open_mark[s] - 1
  :: else -> skip
  fi
}

inline mark_pass_used(s) {
  /* Lifecycle::markPassUsed */
  open_buffer(s);
  dirty[s] = 1; pass_work[s] = 1
}

inline commit_through(s, m) {
  /* Lifecycle::commitThrough(m): what a deferred flush runs */
#ifndef OLD_RULE
  if
  :: open_mark[s] <= m -> mark_pass_used(s)
  :: else -> skip
  fi;
#endif
  end_encoder(s);
  commit_open(s)
}

/* The deferred flush of a stream: MPSStream::flushAsync's dispatch_async
   block (SimStream::serviceFlushRequest): runs once the section is free. */
proctype flusher(byte s) {
  mtype k;
  byte a, c, fm;
end:
  do
  :: atomic {
       (serial[s] == 0 && (flush_req[s] != 0 || flush_any[s])) ->
       serial[s] = _pid + 1; fm = flush_req[s]; flush_req[s] = 0;
       flush_any[s] = 0
     };
     atomic {
       commit_through(s, fm);
       serial[s] = 0
     }
  od
}

inline enter(s) { atomic { serial[s] == 0 -> serial[s] = _pid + 1 } }
inline leave(s) { serial[s] = 0 }

inline flush_async(p, m) {
  /* DependencyStream::flushAsync(m) */
#ifdef OLD_RULE
  flush_any[p] = 1
#else
  d_step { if :: flush_req[p] < m -> flush_req[p] = m :: else skip fi }
#endif
}

/* ===== DependencyTracker ===== */

inline add_need(t, m) {
  if
  :: ev[t] < m && need[t] < m -> need[t] = m
  :: else -> skip
  fi
}

inline new_slot(s, b, acc) {
  slot = nrec[b]; nrec[b]++;
  lastslot[b * NS + s] = slot;
  assert(slot < MAXREC);
  rec_state[b * MAXREC + slot] = 1;
  rec_write[b * MAXREC + slot] = acc
}

inline record(s, b, acc, m, bi) {
  /* DependencyTracker::record, with b's lock held: fold the sole-use word
     (exchange for 0), collect what the use must wait for, record it, and
     hand the buffer back to the fast path if only s uses it */
  d_step {
#ifndef NO_REBIND
    if
    :: wrote_at[b * NS + s] == m ->
       /* the same pass wrote b already: nothing to wait for or record; the
          kernel, reading or writing, is one more use of the pass's record */
       myslot[bi] = lastslot[b * NS + s];
       rec_state[b * MAXREC + myslot[bi]] = 1; rec_write[b * MAXREC + myslot[bi]] = 1
    :: else ->
#endif
    if
    :: word_owner[b] != 0 ->
       t = word_owner[b] - 1;
       printf("stream %d takes buffer %d over from stream %d (mark %d)\n", s, b, t, word_mark[b]);
       if
       :: word_wrote[b] -> has_write[b] = 1; lw_s[b] = t; lw_m[b] = word_mark[b];
                           wrote_at[b * NS + t] = word_mark[b];
                           i = 0;
                           do :: i < NS -> reads[b * NS + i] = 0; i++ :: else -> break od
       :: else -> if :: reads[b * NS + t] < word_mark[b] -> reads[b * NS + t] = word_mark[b]
                     :: else -> skip fi
       fi;
       word_owner[b] = 0; word_wrote[b] = 0; word_mark[b] = 0
    :: else -> skip
    fi;
#ifndef NO_RAW
    if
    :: has_write[b] && lw_s[b] != s -> add_need(lw_s[b], lw_m[b])
    :: else -> skip
    fi;
#endif
    if
    :: acc == WRITE ->
#ifndef NO_WAR
       i = 0;
       do
       :: i < NS -> if :: i != s && reads[b * NS + i] != 0 -> add_need(i, reads[b * NS + i])
                       :: else -> skip fi; i++
       :: else -> break
       od;
#endif
       has_write[b] = 1; lw_s[b] = s; lw_m[b] = m; wrote_at[b * NS + s] = m;
       i = 0;
       do :: i < NS -> reads[b * NS + i] = 0; i++ :: else -> break od
    :: else ->
       if :: reads[b * NS + s] < m -> reads[b * NS + s] = m :: else -> skip fi
    fi;
    /* sole user again? */
    t = 0; i = 0;
    do
    :: i < NS -> if :: i != s && reads[b * NS + i] != 0 -> t = 1 :: else -> skip fi; i++
    :: else -> break
    od;
    if
    :: t == 0 && (!has_write[b] || lw_s[b] == s) ->
       word_owner[b] = s + 1; word_wrote[b] = has_write[b];
       word_mark[b] = reads[b * NS + s];
       if :: has_write[b] && lw_m[b] > word_mark[b] -> word_mark[b] = lw_m[b] :: else -> skip fi;
       has_write[b] = 0; reads[b * NS + s] = 0
    :: else -> skip
    fi;
    new_slot(s, b, acc);
    myslot[bi] = slot
#ifndef NO_REBIND
    fi
#endif
    ;
    i = 0; t = 0
  }
}

inline fast_publish(s, b, acc, m, bi) {
  /* DependencyTracker::tryFastPath, publication of buffer b */
#ifdef OLD_RULE
  /* sole_point_.store(mark) ... then sole_user_ re-checked */
  if
  :: word_owner[b] == s + 1 ->
     d_step { word_mark[b] = m; new_slot(s, b, acc); myslot[bi] = slot };
     printf("stream %d fast path: publishes buffer %d at mark %d\n", s, b, m);
     if
     :: word_owner[b] == s + 1 -> skip
     :: else -> fast = 2
     fi
  :: else -> fast = 2
  fi
#else
  /* compare_exchange_strong on sole_ */
  d_step {
    if
    :: word_owner[b] == s + 1 && word_mark[b] == m ->  /* recorded already */
       myslot[bi] = lastslot[b * NS + s]; rec_state[b * MAXREC + myslot[bi]] = 1;
       if :: acc == WRITE -> rec_write[b * MAXREC + myslot[bi]] = 1 :: else -> skip fi
    :: word_owner[b] == s + 1 && word_mark[b] != m ->
       word_mark[b] = m; new_slot(s, b, acc); myslot[bi] = slot; published = 1;
       printf("stream %d fast path: publishes buffer %d at mark %d\n", s, b, m)
    :: else -> fast = 2
    fi
  }
#endif
}

inline void_slot(b, bi) {
  if
  :: myslot[bi] != NONE_B -> rec_state[b * MAXREC + myslot[bi]] = 2; myslot[bi] = NONE_B
  :: else -> skip
  fi
}

inline fast_check(s) {
  /* DependencyTracker::tryFastPath, first loop: every buffer s's alone */
  fast = 1; published = 0;
  if
  :: word_owner[ub[0]] != s + 1 || (ua[0] == WRITE && !word_wrote[ub[0]]) -> fast = 2
  :: else -> skip
  fi;
  if
  :: fast == 1 && ub[1] != NONE_B &&
     (word_owner[ub[1]] != s + 1 || (ua[1] == WRITE && !word_wrote[ub[1]])) -> fast = 2
  :: else -> skip
  fi
}

inline fast_finish() {
  /* tryFastPath's result: fast = 1 recorded, 2 not taken, 3 partly
     recorded (some uses published before one failed) */
#ifdef OLD_RULE
  if
  :: fast == 2 -> void_slot(ub[0], 0); void_slot(ub[1], 1)
  :: else -> skip
  fi
#else
  if
  :: fast == 2 && published -> fast = 3
  :: else -> skip
  fi
#endif
}

inline lock_all() {
  /* DependencyTracker::use locks, in address (here: index) order */
  if
  :: ub[1] == NONE_B -> atomic { !buf_lock[ub[0]] -> buf_lock[ub[0]] = 1 }
  :: ub[1] != NONE_B && ub[0] < ub[1] ->
     atomic { !buf_lock[ub[0]] -> buf_lock[ub[0]] = 1 };
     atomic { !buf_lock[ub[1]] -> buf_lock[ub[1]] = 1 }
  :: ub[1] != NONE_B && ub[0] > ub[1] ->
     atomic { !buf_lock[ub[1]] -> buf_lock[ub[1]] = 1 };
     atomic { !buf_lock[ub[0]] -> buf_lock[ub[0]] = 1 }
  fi
}

inline unlock_all() {
  buf_lock[ub[0]] = 0;
  if :: ub[1] != NONE_B -> buf_lock[ub[1]] = 0 :: else -> skip fi
}

inline cycle_check(s, p, m) {
  /* DependencyTracker::waitsForItself: follow the waits while each awaited
     mark is uncommitted, one hop per step (the C++ reads them one by one);
     back at s, check that every mark on the chain is still uncommitted and
     every wait still published. */
  cyc = 0; t = p; tm = m; i = 0;
  do
  :: atomic {
       if
       :: committed_mark[t] >= tm || i > NS -> break
       :: else -> chain_s[i] = t; chain_m[i] = tm; i++
       fi;
       if
       :: t == s -> cyc = 1; break
       :: else -> skip
       fi
     };
     atomic {
       if
       :: waiting_m[t] == 0 -> break
       :: else -> tm = waiting_m[t]; t = waiting_s[t]
       fi
     }
  od;
#ifndef NO_REVALIDATE
  atomic {
    j = 0;
    do
    :: cyc && j < i ->
       if
       :: committed_mark[chain_s[j]] >= chain_m[j] -> cyc = 0
       :: j + 1 < i && (waiting_s[chain_s[j]] != chain_s[j + 1] ||
                        waiting_m[chain_s[j]] != chain_m[j + 1]) -> cyc = 0
       :: else -> skip
       fi;
       j++
    :: else -> break
    od;
    j = 0
  };
#endif
  atomic { i = 0; t = 0; tm = 0 }
}

inline cycle_check_old(s, p) {
  /* before the fix: only kInPass waiters, by stream, no liveness */
  atomic {
    t = p; cyc = 0; i = 0;
    do
    :: i > NS -> break
    :: t == s -> cyc = 1; break
    :: else ->
       if
       :: waiting_m[t] == 0 -> break
       :: else -> t = waiting_s[t]
       fi;
       i++
    od;
    i = 0; t = 0
  }
}

inline clear_needs() {
  i = 0;
  do :: i < NS -> need[i] = 0; i++ :: else -> break od;
  i = 0
}

inline abort_op() {
  /* the op raised after recording: its uses never run */
  raised++;
  void_slot(ub[0], 0);
  if :: ub[1] != NONE_B -> void_slot(ub[1], 1) :: else -> skip fi
}

/* DependencyTracker::use + the op's encoding, kBeforeEncoding (graph ops,
   copies): the caller holds s's serial section and no encoder. */
inline use_before_encoding(s) {
  /* interleaving points: between the fast path's buffers, between the
     locked path's lock acquisitions and records, and wherever a step
     blocks; the rest of an op runs in its serial section and touches
     other streams' state only through the steps modelled separately */
  atomic {
    myslot[0] = NONE_B; myslot[1] = NONE_B; clear_needs(); failed = 0;
    end_encoder(s);                               /* closePass(false) */
    m = open_mark[s];
    fast_check(s);
    if
    :: fast == 1 -> fast_publish(s, ub[0], ua[0], m, 0)
    :: else -> skip
    fi
  };
  atomic {
    if
    :: fast == 1 && ub[1] != NONE_B -> fast_publish(s, ub[1], ua[1], m, 1)
    :: else -> skip
    fi;
    fast_finish();
    if
    :: fast == 3 ->                               /* kPartlyRecorded */
       void_slot(ub[0], 0); void_slot(ub[1], 1);
       mark_pass_used(s); end_encoder(s);         /* closePass(true) */
       m = open_mark[s]
    :: else -> skip
    fi
  };
  if
  :: fast != 1 ->
     lock_all();
     record(s, ub[0], ua[0], m, 0);
     if :: ub[1] != NONE_B -> record(s, ub[1], ua[1], m, 1) :: else -> skip fi;
     atomic { unlock_all(); own = 0; p = 0 };
     /* use()'s resolution, first loop: every mark to wait for on the GPU committed */
     do
     :: atomic {
          p < NS && !(need[p] != 0 && ev[p] < need[p] && committed_mark[p] < need[p]) -> p++
        }
     :: p < NS && need[p] != 0 && ev[p] < need[p] && committed_mark[p] < need[p] ->
#ifdef OLD_RULE
        atomic { flush_async(p, need[p]); p++ }
#else
        atomic {
          if
          :: !own -> end_encoder(s); commit_open(s); own = 1   /* commitOpen() */
          :: else -> skip
          fi
        };
        atomic { flush_async(p, need[p]); waiting_s[s] = p; waiting_m[s] = need[p] };
        cycle_check(s, p, need[p]);
        if
        :: cyc -> waiting_m[s] = 0; failed = 1; break
        :: else -> skip
        fi;
        (committed_mark[p] >= need[p]);                 /* waitCommitted */
        atomic { waiting_m[s] = 0; p++ }
#endif
     :: atomic { p >= NS -> break }
     od;
     atomic {
     p = 0;
     do
     :: failed -> break
     :: !failed && p < NS ->
        if
        :: need[p] != 0 && ev[p] < need[p] ->
           open_buffer(s); openbuf[s]!WAIT, p, need[p]; dirty[s] = 1; pass_work[s] = 1;
           printf("stream %d encodes a GPU wait for stream %d mark %d (committed: %d)\n",
                  s, p, need[p], committed_mark[p]);
        :: else -> skip
        fi;
        p++
     :: else -> break
     od;
     p = 0
     }
  :: else -> skip
  fi;
  atomic {
    if
    :: failed -> abort_op()
    :: else ->
       /* the op's kernel, in its own pass */
       mark_pass_used(s);
       openbuf[s]!KERNEL, ub[0], myslot[0];
       if :: ub[1] != NONE_B -> openbuf[s]!KERNEL, ub[1], myslot[1] :: else -> skip fi
    fi
  }
}

/* DependencyTracker::use, kInPass (getMTLBufferStorage while a custom
   kernel holds the compute encoder), one buffer; the kernel joins the
   open pass. */
inline use_in_pass(s) {
  atomic {
    myslot[0] = NONE_B; myslot[1] = NONE_B; clear_needs(); failed = 0;
    mark_pass_used(s);                            /* commandEncoder() */
    m = open_mark[s];
    fast_check(s);
    if
    :: fast == 1 -> fast_publish(s, ub[0], ua[0], m, 0)
    :: else -> skip
    fi;
    fast_finish()
  };
  if
  :: fast != 1 ->
     lock_all();
     record(s, ub[0], ua[0], m, 0);
     atomic { unlock_all(); p = 0 };
     do
     :: atomic { p < NS && !(need[p] != 0 && ev[p] < need[p]) -> p++ }
     :: p < NS && need[p] != 0 && ev[p] < need[p] ->
        atomic {
          if
          :: committed_mark[p] < need[p] -> flush_async(p, need[p])
          :: else -> skip
          fi;
          waiting_s[s] = p; waiting_m[s] = need[p]
        };
#ifdef OLD_RULE
        cycle_check_old(s, p);
#else
        cycle_check(s, p, need[p]);
#endif
        if
        :: cyc -> waiting_m[s] = 0; failed = 1; break
        :: else -> skip
        fi;
        (ev[p] >= need[p]);                             /* waitCompleted */
        atomic { waiting_m[s] = 0; p++ }
     :: atomic { p >= NS -> break }
     od;
     p = 0
  :: else -> skip
  fi;
  if
  :: failed -> abort_op()
  :: else -> openbuf[s]!KERNEL, ub[0], myslot[0]
  fi
}

inline sync(s, how) {
  /* Lifecycle::synchronize(NONE or COMMIT) */
  end_encoder(s);
  if
  :: how == SYNC_COMMIT -> commit_open(s)
  :: else -> skip
  fi
}

inline commit_and_wait(s) {
  /* MPSStream::synchronize(COMMIT_AND_WAIT), in the serial section */
  atomic {
    enter(s);
    end_encoder(s);
    commit_open(s);
    (completions[s] == commits[s]);
    leave(s)
  }
}

inline op2(os, ob0, oa0, ob1, oa1, ohow) {
  /* one graph op: enter the section, record and encode, sync, leave */
  atomic {
    enter(os);
    ub[0] = ob0; ua[0] = oa0; ub[1] = ob1; ua[1] = oa1
  };
  use_before_encoding(os);
  atomic {
    sync(os, ohow);
    leave(os)
  }
}

#define LOCALS \
  mtype k; byte a, c, i, j, t, tm, m, p, slot, fast; \
  bool published, cyc, own, failed; \
  byte need[NS]; byte myslot[2]; byte ub[2]; bool ua[2]; byte prev; \
  byte chain_s[NS + 1]; byte chain_m[NS + 1]

/* Two streams that consume each other's outputs in a cycle
   (DependencyTest.StreamsConsumingEachOthersOutputsInACycleFinish). */
proctype cycle_worker(byte s; byte mine; byte theirs) {
  LOCALS;
  op2(s, theirs, READ, mine, WRITE, SYNC_NONE);
#if CYCLE_OPS > 2
  op2(s, theirs, READ, mine, WRITE, SYNC_NONE);
#endif
  op2(s, theirs, READ, mine, WRITE, SYNC_COMMIT);
  commit_and_wait(s);
  finished++
}

/* Stream 0 writes x and, in the same serial section, encodes a kernel that
   reads y; stream 1 reads x and writes y in between. No order exists: the
   tracker must raise, not hang
   (DependencyRaceTest.InPassWaitThatNeedsItsOwnUncommittedWorkIsReported). */
proctype in_pass_writer() {
  LOCALS;
  enter(0);
  ub[0] = 0; ua[0] = WRITE; ub[1] = NONE_B;
  use_before_encoding(0);
  sync(0, SYNC_NONE);
  ub[0] = 1; ua[0] = READ; ub[1] = NONE_B;
  use_in_pass(0);
  sync(0, SYNC_NONE);
  leave(0);
  commit_and_wait(0);
  finished++
}

proctype in_pass_other() {
  LOCALS;
  op2(1, 0, READ, 1, WRITE, SYNC_COMMIT);
  commit_and_wait(1);
  finished++
}

/* Stream 0's pass binds buffer 0 twice, as an in-place op binds its
   output, then the same tensor as an input (a write, then a read or a
   write); stream 1 reads it or overwrites it in between. Stream 1 waits for
   the whole pass, so the second binding needs nothing: the tracker must
   neither wait for stream 1 nor raise (InPassRebindingTest in
   tests/unit/stream_dependencies_test.cpp). */
proctype rebind_writer() {
  LOCALS;
  enter(0);
  ub[0] = 0; ua[0] = WRITE; ub[1] = NONE_B;
  use_in_pass(0);
  if
  :: ua[0] = WRITE
  :: ua[0] = READ /* the in-place op's input binding */
  fi;
  use_in_pass(0);
  sync(0, SYNC_NONE);
  leave(0);
  commit_and_wait(0);
  finished++
}

proctype rebind_other() {
  LOCALS;
  if
  :: op2(1, 0, READ, 1, WRITE, SYNC_COMMIT)
  :: op2(1, 0, WRITE, NONE_B, READ, SYNC_COMMIT)
  fi;
  commit_and_wait(1);
  finished++
}

/* Streams in a ring, each handing a buffer on to the next: stream s reads
   buffer (s + NS - 1) % NS and writes buffer s; stream 0 then reuses its
   own output, which the next stream read, and the buffer it was handed,
   overwriting each without reading it, as the allocator does when it hands
   a freed block to another stream. */
proctype ring_worker(byte s) {
  LOCALS;
  prev = (s + NS - 1) % NS;
  op2(s, prev, READ, s, WRITE, SYNC_NONE);
  if
  :: s == 0 -> op2(s, s, WRITE, NONE_B, READ, SYNC_NONE);
               op2(s, prev, WRITE, NONE_B, READ, SYNC_COMMIT)
  :: else -> skip
  fi;
  commit_and_wait(s);
  finished++
}

init {
  byte s;
  atomic {
    s = 0;
    do
    :: s < NS -> open_mark[s] = 1; run gpu(s); run flusher(s); s++
    :: else -> break
    od;
#if SCENARIO == 1
    run cycle_worker(0, 0, 1);
    run cycle_worker(1, 1, 0)
#elif SCENARIO == 2
    run in_pass_writer();
    run in_pass_other()
#elif SCENARIO == 4
    run rebind_writer();
    run rebind_other()
#else
    s = 0;
    do
    :: s < NS -> run ring_worker(s); s++
    :: else -> break
    od
#endif
  };
  (finished == NS);
  /* everything recorded and not abandoned ran on the GPU */
  s = 0;
  do
  :: s < NS -> (completions[s] == commits[s]); s++
  :: else -> break
  od;
  skip;
#if SCENARIO != 2
  /* these scenarios have a valid order: nobody may be told otherwise */
  assert(raised == 0);
#endif
  d_step {
    s = 0;
    do
    :: s < NB * MAXREC -> assert(rec_state[s] != 1); s++
    :: else -> break
    od;
    s = 0
  }
}
