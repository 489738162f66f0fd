// One rank of benchmarks/cpu_peers.py for Intel oneCCL (CPU): the method of
// cpu_peers_worker.py in C++ (float32 sum; size = bytes of the larger buffer; one checked
// call with exact sums, warm-up calls, then repetitions of back-to-back calls, each after
// a barrier), writing this rank's per-repetition seconds as JSON to OUT/rank<r>.json.
//
//   cpu_peers_ccl OUT REPS WARMUP COLLS SIZE...      (COLLS: all_reduce,all_gather,
//                                                     reduce_scatter,broadcast)
//
// Rank and size come from RANK / WORLD_SIZE. oneCCL's key-value store is bootstrapped
// through a file (RT_CCL_KVS_FILE): rank 0 writes the main store's address there, the
// others read it, so no MPI launcher is needed (CCL_PROCESS_LAUNCHER=none).
#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;

int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : -1;
}

void publish(const std::string& path, const ccl::kvs::address_type& a) {
    std::string tmp = path + ".tmp";
    { std::ofstream f(tmp, std::ios::binary); f.write(a.data(), a.size()); }
    std::rename(tmp.c_str(), path.c_str());
}

ccl::kvs::address_type fetch(const std::string& path) {
    ccl::kvs::address_type a{};
    for (auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(120);) {
        std::ifstream f(path, std::ios::binary);
        if (f && f.read(a.data(), a.size()) && f.gcount() == (std::streamsize)a.size()) return a;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::fprintf(stderr, "oneCCL: no store address in %s after 120 s\n", path.c_str());
    std::exit(2);
}

int iters_for(size_t nbytes) {
    size_t i = (size_t(32) << 20) / std::max<size_t>(nbytes, 1);
    return int(std::max<size_t>(5, std::min<size_t>(500, i)));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: %s OUT REPS WARMUP COLLS SIZE...\n", argv[0]);
        return 2;
    }
    std::string out = argv[1];
    int reps = std::atoi(argv[2]), warmup = std::atoi(argv[3]);
    std::vector<std::string> colls;
    { std::stringstream ss(argv[4]); std::string c; while (std::getline(ss, c, ',')) colls.push_back(c); }
    std::vector<size_t> sizes;
    for (int i = 5; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    int rank = env_int("RANK"), n = env_int("WORLD_SIZE");
    const char* kf = std::getenv("RT_CCL_KVS_FILE");
    if (rank < 0 || n < 1 || !kf) {
        std::fprintf(stderr, "set RANK, WORLD_SIZE and RT_CCL_KVS_FILE\n");
        return 2;
    }
    ccl::init();
    std::shared_ptr<ccl::kvs> kvs;
    if (rank == 0) {
        kvs = ccl::create_main_kvs();
        publish(kf, kvs->get_address());
    } else {
        kvs = ccl::create_kvs(fetch(kf));
    }
    auto comm = ccl::create_communicator(n, rank, kvs);
    auto barrier = [&] { ccl::barrier(comm).wait(); };
    auto v = ccl::get_library_version();

    std::ostringstream js;
    js << "{\"info\": \"oneCCL " << v.full << "\", \"times\": {";
    bool first_coll = true;
    for (const auto& coll : colls) {
        bool whole = coll == "all_reduce" || coll == "broadcast";  // one buffer, in place
        if (!whole && coll != "all_gather" && coll != "reduce_scatter") continue;
        js << (first_coll ? "" : ", ") << "\"" << coll << "\": {";
        first_coll = false;
        bool first_size = true;
        for (size_t nbytes : sizes) {
            size_t count = std::max<size_t>(1, nbytes / 4);
            if (!whole && count < size_t(n)) continue;
            size_t per = whole ? count : count / n;
            std::vector<float> big(whole ? count : per * n), small(per);
            std::function<void()> call;
            if (coll == "all_reduce")
                call = [&] { ccl::allreduce(big.data(), big.data(), count, ccl::reduction::sum, comm).wait(); };
            else if (coll == "broadcast")  // from rank 0
                call = [&] { ccl::broadcast(big.data(), count, ccl::datatype::float32, 0, comm).wait(); };
            else if (coll == "all_gather")
                call = [&] {
                    ccl::allgather(small.data(), big.data(), per, ccl::datatype::float32, comm).wait();
                };
            else
                call = [&] {
                    ccl::reduce_scatter(big.data(), small.data(), per, ccl::reduction::sum, comm).wait();
                };
            // the checked call: rank r contributes r + 1 (+ j in block j of a reduce-scatter)
            float want;
            if (coll == "all_gather") {
                std::fill(small.begin(), small.end(), float(rank + 1));
            } else {
                for (size_t k = 0; k < big.size(); ++k) big[k] = float(rank + 1) + (coll == "reduce_scatter" ? float(k / per) : 0.f);
            }
            call();
            bool ok = true;
            if (coll == "all_reduce") {
                want = float(n) * float(n + 1) / 2.f;
                for (float x : big) ok &= x == want;
            } else if (coll == "broadcast") {
                for (float x : big) ok &= x == 1.f;
            } else if (coll == "all_gather") {
                for (size_t k = 0; k < big.size(); ++k) ok &= big[k] == float(k / per + 1);
            } else {
                want = float(n) * float(n + 1) / 2.f + float(n) * float(rank);
                for (float x : small) ok &= x == want;
            }
            if (!ok) {
                std::fprintf(stderr, "oneCCL: WRONG %s result at %zu B\n", coll.c_str(), nbytes);
                return 3;
            }
            std::fill(big.begin(), big.end(), coll == "broadcast" ? 1.f : 0.f);
            std::fill(small.begin(), small.end(), 0.f);
            for (int w = 0; w < warmup; ++w) call();
            int iters = iters_for(nbytes);
            js << (first_size ? "" : ", ") << "\"" << nbytes << "\": [";
            first_size = false;
            for (int r = 0; r < reps; ++r) {
                barrier();
                auto t0 = Clock::now();
                for (int i = 0; i < iters; ++i) call();
                double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
                js << (r ? ", " : "") << s;
                barrier();  // untimed: as the Python worker
            }
            js << "]";
        }
        js << "}";
    }
    js << "}}";
    barrier();
    std::ofstream(out + "/rank" + std::to_string(rank) + ".json") << js.str();
    return 0;
}
