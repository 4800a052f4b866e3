// placeholder until the parallel layer lands
namespace moetrain {}
